"""`python -m apexlite check`: static listing of apex APIs with their apexlite status.

Also: the status table agrees with MIGRATION.md's tables row by row, and with what the names resolve
to at run time; any file Python would run is read; anything else gets one line and its own exit status.
"""
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from apexlite import api_status, check
from apexlite.compat import apex_tree
from apexlite.compat.child_path.sitecustomize import LEGACY_TOP_LEVEL, REFUSED_EXTENSIONS

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = textwrap.dedent("""
    import sys
    import apex.amp as A
    from apex import amp
    from apex.parallel import DistributedDataParallel as DDP
    from apex.fp16_utils import *
    from apex.contrib.xentropy import SoftmaxCrossEntropyLoss
    from apex.RNN import LSTM
    import amp_C

    open(sys.argv[0] + ".ran", "w").write("executed")  # must never run
    model, opt = A.initialize(None, None, opt_level="O2")
    with amp.scale_loss(1.0, opt) as scaled:
        pass
    amp._amp_state.loss_scalers[0].loss_scale()
    value = to_python_float(scaled)
    handle = amp.init()
    amp.no_such_function()
    amp_C.multi_tensor_l2norm
    print(apex.__version__ if False else DDP)
""")


def _statuses(source):
    return {name: (lines, status) for name, lines, status in check.scan(source)}


def test_scan_classifies_supported_differs_unsupported_and_refused():
    rows = _statuses(SAMPLE)
    assert rows["apex.amp.scale_loss"][0] == [13] and rows["apex.amp.scale_loss"][1].startswith("differs: ")
    assert rows["apex.amp.init"] == ([17], "supported")
    assert rows["apex.amp.initialize"][1].startswith("differs: ")
    assert rows["apex.amp.initialize"][0] == [12]  # found through the `import apex.amp as A` alias
    assert rows["apex.parallel.DistributedDataParallel"][0] == [5, 20]
    assert rows["apex.parallel.DistributedDataParallel"][1].startswith("differs: built on torch DDP")
    assert rows["apex.fp16_utils.to_python_float"] == ([16], "supported")  # through the star import
    assert rows["apex.amp._amp_state"] == ([15], "supported")  # an attribute of the state object is its API
    assert rows["apex.contrib.xentropy"][1].startswith("refused: ") and "cross_entropy" in rows[
        "apex.contrib.xentropy"][1]
    assert rows["apex.RNN"][0] == [8] and rows["apex.RNN"][1].startswith("refused: ")
    assert rows["apex.amp.no_such_function"] == ([18], api_status.NOT_IN_APEX)
    assert rows["amp_C.multi_tensor_l2norm"][1].startswith("differs: torch ops")


@pytest.mark.parametrize("source,line", [
    ("import torch.nn.functional as F\nloss = F.binary_cross_entropy(p, t)\n", 2),
    ("import torch\nloss = torch.nn.functional.binary_cross_entropy(p, t)\n", 2),
    ("from torch.nn import functional as F\nF.binary_cross_entropy(p, t)\n", 2),
    ("from torch.nn.functional import binary_cross_entropy as bce\nbce(p, t)\n", 1),
    ("from torch.nn.functional import *\nbinary_cross_entropy(p, t)\n", 2),
    ("import torch.nn as nn\ncriterion = nn.BCELoss()\n", 2),
    ("from torch import nn\ncriterion = nn.BCELoss()\n", 2),
    ("from torch.nn.modules.loss import BCELoss\n", 1),
])
def test_o1_refused_torch_functions_are_flagged_with_the_fix(source, line):
    rows = check.scan(source)
    assert len(rows) == 1
    api, lines, status = rows[0]
    assert api in ("torch.nn.functional.binary_cross_entropy", "torch.nn.BCELoss")
    assert line in lines
    assert status.startswith("raises at O1: ") and "BCEWithLogitsLoss" in status
    assert "register_float_function(torch, 'sigmoid')" in status


def test_logit_losses_and_other_torch_uses_are_not_flagged():
    source = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
              "nn.BCEWithLogitsLoss()(x, y)\nF.binary_cross_entropy_with_logits(x, y)\ntorch.sigmoid(x)\n")
    assert check.scan(source) == []


def test_cli_flags_bce_and_fails_the_exit_status(tmp_path, capsys):
    script = tmp_path / "bce.py"
    script.write_text("from apex import amp\nimport torch.nn as nn\nloss = nn.BCELoss()\n")
    assert check.main([str(script)]) == 1
    out = capsys.readouterr().out
    assert "torch.nn.BCELoss" in out and "line 3: raises at O1" in out
    assert "1 raise at O1 with fp16/bf16 inputs" in out


@pytest.mark.parametrize("source,name", [
    ("import apex.RNN\n", "apex.RNN"),
    ("from apex import RNN\nRNN.LSTM(4, 4, 1)\n", "apex.RNN"),
    ("from apex.RNN import mLSTM\n", "apex.RNN"),
    ("from apex.RNN.models import LSTM\n", "apex.RNN"),
    ("from apex.contrib.layer_norm.layer_norm import FastLayerNormFN\n", "apex.contrib.layer_norm"),
    ("import apex.mlp\n", "apex.mlp"),
])
def test_names_in_refused_modules_are_reported_as_the_refused_module(source, name):
    rows = _statuses(source)
    assert list(rows) == [name]
    status = rows[name][1]
    assert status.startswith("refused: ") and status == "refused: " + apex_tree.tree().status(name)[1]


# every module path and name of apex's tree: never a misspelling, reported as itself or its refused module
TREE_ROWS = sorted(apex_tree.tree().rows)


def test_no_real_apex_path_is_called_a_misspelling():
    tree = apex_tree.tree()
    for name in TREE_ROWS:
        reported, status = check.status_of(name)
        assert status != api_status.NOT_IN_APEX, name
        refused = tree.outermost_refused(name)
        assert reported == (refused.name if refused is not None else name), name
        assert status.split(":")[0] == tree.status(reported)[0]


@pytest.mark.parametrize("source", [
    "from apex.normalization import fused_layer_norm\nfused_layer_norm.FusedLayerNorm\n",
    "import apex.normalization.fused_layer_norm\n",
    "import apex.normalization.fused_layer_norm as fln\n",
])
def test_a_submodule_is_never_taken_for_a_function(source):
    rows = _statuses(source)
    assert rows["apex.normalization.fused_layer_norm"][1] == apex_tree.tree().status_text(
        "apex.normalization.fused_layer_norm")
    assert apex_tree.tree().row("apex.normalization.fused_layer_norm").kind == "module"


def test_a_misspelling_is_reported_at_its_first_unknown_component():
    rows = _statuses("import apex\napex.parralel.DistributedDataParallel\nfrom apex.amp import initialise\n")
    assert rows == {"apex": ([1], "supported"), "apex.parralel": ([2], api_status.NOT_IN_APEX),
                    "apex.amp.initialise": ([3], api_status.NOT_IN_APEX)}


def test_json_report(tmp_path, capsys):
    script = tmp_path / "legacy.py"
    script.write_text(SAMPLE)
    assert check.main([str(script), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["script"] == str(script) and report["exit_status"] == 1
    by_api = {entry["api"]: entry for entry in report["apis"]}
    assert by_api["apex.amp.init"] == {"api": "apex.amp.init", "lines": [17], "status": "supported", "note": ""}
    assert by_api["apex.contrib.xentropy"]["status"] == "refused"
    assert "cross_entropy" in by_api["apex.contrib.xentropy"]["note"]
    assert report["counts"]["refused"] == 2 and report["counts"]["unsupported"] == 1
    assert sum(report["counts"].values()) == len(report["apis"])


def test_torch_warnings_raised_while_looking_are_not_printed_on_checks_account(monkeypatch):
    import torch

    def deprecated_attribute(name):
        warnings.warn(f"torch.nn.functional.{name} is deprecated", FutureWarning)
        raise AttributeError(name)

    monkeypatch.setattr(torch.nn.functional, "__getattr__", deprecated_attribute, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = check.scan("import torch.nn.functional as F\nF.old_function(x)\nF.binary_cross_entropy(x, y)\n")
    assert [api for api, _, _ in rows] == ["torch.nn.functional.binary_cross_entropy"]


def test_check_imports_no_compat_module():
    code = ("import sys\nfrom apexlite import check\ncheck.scan(open(sys.argv[1]).read())\n"
            "print(sorted(m for m in sys.modules if m.split('.')[:3] in (['apexlite', 'compat', 'apex'], "
            "['apexlite', 'compat', 'amp_C'])))")
    result = subprocess.run([sys.executable, "-c", code, str(ROOT / "examples" / "fused_adam_o2.py")],
                            capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- MIGRATION.md's tables and the status table agree ---------------------------------------------------------

_FULL_PREFIXES = ("apex.", "amp_C.", "torch.")
_EXTENSIONS = LEGACY_TOP_LEVEL + REFUSED_EXTENSIONS  # apex's top-level modules: apex, amp_C, fused_layer_norm_cuda...


def _migration_rows():
    """(section, api, status) for every API named in the first column of MIGRATION.md's status tables."""
    rows, section, status_column = [], None, None
    for line in (ROOT / "MIGRATION.md").read_text().splitlines():
        if line.startswith("## "):
            section, status_column = line[3:].split()[0], None
        elif line.startswith("|") and status_column is None:
            header = [cell.strip() for cell in line.strip().strip("|").split("|")]
            status_column = header.index("status") if "status" in header else -1
        elif line.startswith("|") and status_column >= 0 and not line.startswith("|---"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            for span in re.findall(r"`([^`]+)`", cells[0]):
                name = re.match(r"[A-Za-z_][\w.]*", span).group(0)
                rows.append((section, _qualify(section, name), cells[status_column]))
    return rows


def _qualify(section, name):
    if name.startswith(_FULL_PREFIXES) or name in ("apex", "amp_C"):
        return name
    if not section.startswith("apex.") and name.split(".")[0] in _EXTENSIONS:
        return name  # a section on apex's extension modules names them in full
    assert section.startswith("apex."), f"{name!r} in a section without a module needs its full name"
    parent, _, leaf = section.rpartition(".")
    return f"{parent}.{name}" if name.startswith(leaf + ".") else f"{section}.{name}"


MIGRATION_ROWS = _migration_rows()


def test_migration_tables_are_found():
    sections = {section for section, _, _ in MIGRATION_ROWS}
    assert {"apex.amp", "apex.optimizers", "apex.parallel", "apex.fp16_utils", "apex.normalization",
            "apex.multi_tensor_apply", "torch"} <= sections
    assert len(MIGRATION_ROWS) > 60


@pytest.mark.parametrize("section,api,migration_status", MIGRATION_ROWS,
                         ids=[api for _, api, _ in MIGRATION_ROWS])
def test_check_reports_what_migration_states(section, api, migration_status):
    assert migration_status in api_status.KINDS
    if api.startswith("torch."):
        reported = check.scan(f"import torch\n{api}\n")[0][2]
    else:
        reported = check.status_of(api)[1]
    assert reported.split(":")[0] == migration_status, f"check says {reported!r}"


def test_every_decided_name_of_the_table_is_in_migration():
    """Each member row with its own status is named in MIGRATION.md (itself, or a re-export of it)."""
    tree = apex_tree.tree()
    in_migration = {api for _, api, _ in MIGRATION_ROWS}
    aliases = {}
    for row in tree.rows.values():
        if row.same_as:
            aliases.setdefault(row.same_as, set()).add(row.name)
    missing = [row.name for row in tree.rows.values() if row.status and not row.is_module
               and not ({row.name} | aliases.get(row.name, set())) & in_migration]
    assert not missing, f"MIGRATION.md has no row for {missing}"


def test_migration_module_table_is_generated_from_the_table():
    text = (ROOT / "MIGRATION.md").read_text()
    assert apex_tree.module_table_section(apex_tree.tree()) in text, (
        "MIGRATION.md's module table is stale: run python scripts/gen_apex_tree.py --migration-only")


def test_torch_rows_are_the_o1_tables_banned_functions():
    assert api_status.raising_at_o1() == ("torch.nn.functional.binary_cross_entropy", "torch.nn.BCELoss")


# --- reading scripts -------------------------------------------------------------------------------------------

def test_cli_reads_without_executing_and_sets_exit_status(tmp_path):
    script = tmp_path / "legacy.py"
    script.write_text(SAMPLE)
    result = subprocess.run([sys.executable, "-m", "apexlite", "check", str(script)], capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1  # unsupported APIs present
    assert not (tmp_path / "legacy.py.ran").exists()
    assert "apex.amp.init" in result.stdout and "line 17: supported" in result.stdout
    assert "unsupported" in result.stdout


def test_cli_all_supported_example_exits_zero(capsys):
    assert check.main([str(ROOT / "examples" / "fused_adam_o2.py")]) == 0
    out = capsys.readouterr().out
    assert "apex.optimizers.FusedAdam" in out and "0 unsupported" in out


@pytest.mark.parametrize("raw", [
    "# -*- coding: latin-1 -*-\n# caf\u00e9 \u00e0 la cr\u00e8me\nfrom apex import amp\namp.initialize\n".encode("latin-1"),
    b"\xef\xbb\xbffrom apex import amp\namp.initialize\n",
    "# coding: cp1252\nname = '\u20ac'\nfrom apex import amp\namp.initialize\n".encode("cp1252"),
])
def test_reads_any_encoding_python_accepts(tmp_path, capsys, raw):
    script = tmp_path / "encoded.py"
    script.write_bytes(raw)
    compile(raw, str(script), "exec")  # Python itself accepts the file
    assert check.main([str(script)]) == 0
    assert "apex.amp.initialize" in capsys.readouterr().out


@pytest.mark.parametrize("source,name,status", [
    ("from apex.no_such_module import *\n", "apex.no_such_module", "unsupported"),
    ("from apex.contrib.xentropy import *\n", "apex.contrib.xentropy", "refused"),
    ("from apex.amp.no_such import *\n", "apex.amp.no_such", "unsupported"),
])
def test_star_import_of_missing_module_is_reported(source, name, status):
    rows = _statuses(source)
    assert rows[name][1].startswith(status + ": ")


def test_star_import_binds_only_apex_names():
    rows = _statuses("from apex import *\nfrom amp_C import *\nimport torch\namp.initialize\ntorch.zeros(1)\n"
                     "multi_tensor_scale\n")
    assert "apex.amp.initialize" in rows and "amp_C.multi_tensor_scale" in rows
    assert not any(".torch" in name for name in rows)  # apex's module-level `import torch` is not an apex API


def _one_line_error(capsys):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("apexlite check: ") and "Traceback" not in err
    return err


def test_missing_and_non_python_files(tmp_path, capsys):
    assert check.main([str(tmp_path / "missing.py")]) == 2
    assert "no such file" in _one_line_error(capsys)
    cases = {"syntax.py": b"def (:\n", "binary.py": bytes(range(256)) * 4, "nul.py": b"import apex\x00\n",
             "bad_coding.py": b"# coding: no-such-codec\nimport apex\n", "undecodable.py": b"x = '\xe9\xff'\n"}
    for name, raw in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        assert check.main([str(path)]) == 3, name
        assert "not Python source" in _one_line_error(capsys)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and device files (POSIX)")
def test_non_regular_files_are_refused_without_opening(tmp_path, capsys):
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)  # opening it for reading would block until a writer appears
    link = tmp_path / "zero.py"
    link.symlink_to("/dev/zero")  # reading it would never end
    for path, kind in [(fifo, "a FIFO"), (link, "a character device")]:
        assert check.main([str(path)]) == 4
        assert kind in _one_line_error(capsys)


def test_oversized_file_is_refused_without_reading_it(tmp_path, capsys):
    big = tmp_path / "big.py"
    with open(big, "wb") as handle:
        handle.truncate(check.MAX_SOURCE_BYTES + 1)  # sparse: nothing is written
    assert check.main([str(big)]) == 5
    assert "bytes" in _one_line_error(capsys)


def test_exit_statuses_are_documented_in_help(capsys):
    with pytest.raises(SystemExit):
        check.main(["--help"])
    out = capsys.readouterr().out
    for code, meaning in check.EXIT_STATUSES:
        assert f"  {code}  {meaning}" in out


def test_cli_device_path_from_the_command_line_prints_one_line(tmp_path):
    # warnings off: torch itself warns on stderr at import where numpy is missing (a fresh venv)
    result = subprocess.run([sys.executable, "-m", "apexlite", "check", "/dev/null"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 4
    assert result.stderr.strip() == "apexlite check: /dev/null is a character device, not a Python script"


EXTENSIONS_SAMPLE = textwrap.dedent("""
    import importlib
    import torch
    import syncbn
    from fused_adam_cuda import maybe_cast
    import xentropy_cuda
    fused_layer_norm_extension = None


    class FusedLayerNormAffineFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input, weight, bias, shape, eps):
            return fused_layer_norm_extension.forward_affine(input, shape, weight, bias, eps)[0]


    class MixedFusedLayerNorm(torch.nn.Module):
        def __init__(self):
            global fused_layer_norm_extension
            fused_layer_norm_extension = importlib.import_module("fused_layer_norm_cuda")

    syncbn.welford_mean_var(torch.zeros(2, 3))
    apex_C = __import__("apex_C")
""")


def test_scan_follows_apexs_extension_modules_imported_by_name_or_by_importlib():
    rows = _statuses(EXTENSIONS_SAMPLE)
    # bound in a constructor below the Function that uses it, as Megatron-LM's fused layer norm does
    assert rows["fused_layer_norm_cuda.forward_affine"][0] == [13]
    assert rows["fused_layer_norm_cuda.forward_affine"][1] == apex_tree.tree().status_text("fused_layer_norm_cuda")
    assert rows["fused_layer_norm_cuda"][0] == [19]
    assert rows["syncbn.welford_mean_var"][0] == [21] and rows["syncbn.welford_mean_var"][1].startswith("differs: ")
    assert rows["fused_adam_cuda.maybe_cast"][1].startswith("unsupported: ")
    assert rows["xentropy_cuda"][1].startswith("refused: ") and "cross_entropy" in rows["xentropy_cuda"][1]
    assert rows["apex_C"] == ([22], "supported")
    assert check._exit_status(check.scan(EXTENSIONS_SAMPLE)) == 1


@pytest.mark.parametrize("source,message", [
    (b"x = 1\nreturn x\n", "'return' outside function (line 2)"),
    (b"def f():\n    nonlocal y\n", "no binding for nonlocal 'y' found (line 2)"),
])
def test_files_only_the_compiler_refuses_are_refused(tmp_path, capsys, source, message):
    """ast.parse accepts these; Python refuses to run them, so check does too."""
    path = tmp_path / "script.py"
    path.write_bytes(source)
    assert check.main([str(path)]) == 3
    assert message in _one_line_error(capsys)


NOTEBOOK = ROOT / "tests" / "migrate" / "notebooks" / "amp_training.ipynb"


def test_a_notebook_is_read_cell_by_cell(capsys):
    assert check.main([str(NOTEBOOK)]) == 0
    out = capsys.readouterr().out
    assert "3 APIs to know about" in out
    assert "apex.amp.scale_loss  cell 5 line 7: differs" in out and "apex.amp             cell 2 line 4" in out


def test_a_notebook_under_another_name_is_still_a_notebook(tmp_path, capsys):
    """nbformat JSON parses as a Python expression: read as a script it would 'use no apex API'."""
    path = tmp_path / "training.json"
    path.write_bytes(NOTEBOOK.read_bytes())
    assert check.main([str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {entry["api"]: entry["lines"] for entry in report["apis"]}["apex.amp.initialize"] == [[3, 4]]


def test_text_that_is_not_python_gets_a_hint(tmp_path, capsys):
    path = tmp_path / "README.md"
    path.write_text("# Training\n\nRun `python train.py`.\n")
    assert check.main([str(path)]) == 3
    assert "check and migrate read Python scripts (.py) and Jupyter notebooks (.ipynb)" in _one_line_error(capsys)


def test_a_folder_lists_the_files_that_use_apex_and_exits_with_the_highest_status(tmp_path, capsys):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("from apex import amp\namp.initialize\n")
    (tmp_path / "pkg" / "rnn.py").write_text("from apex import RNN\n")
    (tmp_path / "util.py").write_text("import os\n")
    (tmp_path / "broken.py").write_text("def (:\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "apex_copy.py").write_text("from apex import RNN\n")
    assert check.main([str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert f"{tmp_path / 'pkg' / 'train.py'}: 2 APIs to know about" in out
    assert f"{tmp_path / 'pkg' / 'rnn.py'}: 1 APIs to know about" in out
    assert "util.py" not in out and "apex_copy" not in out
    assert f"{tmp_path / 'broken.py'}: refused: " in out
    assert out.rstrip().endswith("total: 4 files read: 2 use apex APIs, 1 use none, 1 refused; skipped: 1 folder "
                                 "(.venv)")
    (tmp_path / "broken.py").unlink()
    assert check.main([str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [entry["exit_status"] for entry in report["files"]] == [1, 0, 0] and report["exit_status"] == 1
