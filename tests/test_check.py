"""`python -m apexlite check`: the command over apexlite.apex_uses: text and JSON reports, exit statuses, and
reading any file Python would run while refusing anything else with one line and its own exit status.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apexlite import apex_uses, check
from tests._helpers.apex_samples import SAMPLE

ROOT = Path(__file__).resolve().parents[1]


def test_the_command_reports_what_the_scan_library_finds():
    assert check.scan is apex_uses.scan and check.status_of is apex_uses.status_of


def test_cli_flags_bce_and_fails_the_exit_status(tmp_path, capsys):
    script = tmp_path / "bce.py"
    script.write_text("from apex import amp\nimport torch.nn as nn\nloss = nn.BCELoss()\n")
    assert check.main([str(script)]) == 1
    out = capsys.readouterr().out
    assert "torch.nn.BCELoss" in out and "line 3: raises at O1" in out
    assert "1 raise at O1 with fp16/bf16 inputs" in out


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


def test_a_refused_file_alone_gets_the_json_entry_a_folder_gives_it(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_bytes(b"def f(:\n")
    assert check.main(["--json", str(path)]) == 3
    captured = capsys.readouterr()
    entry = json.loads(captured.out)
    assert entry == {"script": str(path), "error": f"{path} is not Python source Python would run: invalid syntax "
                                                   "(line 1)", "exit_status": 3}
    assert check.main(["--json", str(tmp_path)]) == 3
    assert json.loads(capsys.readouterr().out)["files"] == [entry]


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
    assert f"{tmp_path / 'pkg' / 'rnn.py'}: 1 API to know about" in out
    assert "util.py" not in out and "apex_copy" not in out
    assert f"{tmp_path / 'broken.py'}: refused: " in out
    assert out.rstrip().endswith("total: 4 files read: 2 use apex APIs, 1 use none, 1 refused; skipped: 1 folder "
                                 "(.venv)")
    (tmp_path / "broken.py").unlink()
    assert check.main([str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [entry["exit_status"] for entry in report["files"]] == [1, 0, 0] and report["exit_status"] == 1
