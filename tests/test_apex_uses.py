"""apexlite.apex_uses: which apex APIs a program uses, through every kind of import and alias, with the
status apexlite gives each.

Also: the status table agrees with MIGRATION.md's tables row by row, and with what the names resolve to
at run time.
"""
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from apexlite import api_status, apex_uses
from apexlite.compat import apex_tree
from apexlite.compat.child_path.sitecustomize import LEGACY_TOP_LEVEL, REFUSED_EXTENSIONS
from tests._helpers.apex_samples import SAMPLE

ROOT = Path(__file__).resolve().parents[1]


def _statuses(source):
    return {name: (lines, status) for name, lines, status in apex_uses.scan(source)}


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
    rows = apex_uses.scan(source)
    assert len(rows) == 1
    api, lines, status = rows[0]
    assert api in ("torch.nn.functional.binary_cross_entropy", "torch.nn.BCELoss")
    assert line in lines
    assert status.startswith("raises at O1: ") and "BCEWithLogitsLoss" in status
    assert "register_float_function(torch, 'sigmoid')" in status


def test_logit_losses_and_other_torch_uses_are_not_flagged():
    source = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
              "nn.BCEWithLogitsLoss()(x, y)\nF.binary_cross_entropy_with_logits(x, y)\ntorch.sigmoid(x)\n")
    assert apex_uses.scan(source) == []


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
        reported, status = apex_uses.status_of(name)
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


def test_torch_warnings_raised_while_looking_are_not_printed_on_checks_account(monkeypatch):
    import torch

    def deprecated_attribute(name):
        warnings.warn(f"torch.nn.functional.{name} is deprecated", FutureWarning)
        raise AttributeError(name)

    monkeypatch.setattr(torch.nn.functional, "__getattr__", deprecated_attribute, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = apex_uses.scan("import torch.nn.functional as F\nF.old_function(x)\nF.binary_cross_entropy(x, y)\n")
    assert [api for api, _, _ in rows] == ["torch.nn.functional.binary_cross_entropy"]


def test_check_imports_no_compat_module():
    code = ("import sys\nfrom apexlite import apex_uses\napex_uses.scan(open(sys.argv[1]).read())\n"
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
        reported = apex_uses.scan(f"import torch\n{api}\n")[0][2]
    else:
        reported = apex_uses.status_of(api)[1]
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
    assert any(api_status.is_failing(status) for _, _, status in apex_uses.scan(EXTENSIONS_SAMPLE))  # check exits 1
