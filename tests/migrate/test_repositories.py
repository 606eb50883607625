"""`migrate PATH...` on what users really have: notebooks, symlinks, folders and whole repositories, files
that are not Python, outputs that cannot be written. Every error is one line with its own exit status."""
import json
import os
import stat
from pathlib import Path

import pytest

from apexlite.migrate import cli

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden")
NOTEBOOKS = Path(__file__).with_name("notebooks")
SCRIPT = GOLDEN / "o1_runtime_device.in.py"
EXPECTED = (GOLDEN / "o1_runtime_device.out.py").read_bytes()
TODO_SCRIPT = GOLDEN / "todo_dynamic_level.in.py"


def one_line_error(capsys, prefix="apexlite migrate: "):
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith(prefix) and "Traceback" not in captured.err
    return captured.err


# --- notebooks -----------------------------------------------------------------------------------
def test_a_notebook_is_migrated_as_one_program_and_written_back(tmp_path, capsys):
    notebook = tmp_path / "train.ipynb"
    notebook.write_bytes((NOTEBOOKS / "amp_training.ipynb").read_bytes())
    assert cli.main([str(notebook), "--in-place"]) == 0
    out = capsys.readouterr().out
    assert "migrated completely (opt_level O1: torch.autocast(float16) + torch.amp.GradScaler)" in out
    assert "note: cell 6 (%%bash) is not Python the kernel runs, so it is kept as it is" in out
    before, after = json.loads((NOTEBOOKS / "amp_training.ipynb").read_text()), json.loads(notebook.read_text())
    changed = [i for i, (a, b) in enumerate(zip(before["cells"], after["cells"])) if a != b]
    assert changed == [1, 2, 4]  # the three code cells that used amp; markdown, outputs, magics kept
    for index in changed:
        assert {k: v for k, v in before["cells"][index].items() if k != "source"} == \
            {k: v for k, v in after["cells"][index].items() if k != "source"}
    cells = ["".join(cell["source"]) if cell["cell_type"] == "code" else "" for cell in after["cells"]]
    assert cells[1] == "!pip install --quiet torch\n%matplotlib inline\nimport torch"  # the amp import went
    assert "scaler = torch.amp.GradScaler(\"cpu\")" in cells[2]  # the scaler lives where initialize was...
    assert cells[4].startswith("%%time\n") and "scaler.scale(loss).backward()" in cells[4]  # ...used two cells on
    assert notebook.read_text().startswith('{\n "cells": [\n  {\n   "cell_type": "markdown"')  # nbformat's layout
    # the migrated cells, run in order as a kernel would (IPython lines left out), train on torch alone
    namespace = {}
    for cell in cells[:5]:  # up to the %%bash cell
        code = "\n".join(line for line in cell.splitlines()
                         if not line.lstrip().startswith(("!", "%")) and not line.endswith("?"))
        exec(compile(code, "cell", "exec"), namespace)
    assert len(namespace["losses"]) == 6 and all(loss == loss for loss in namespace["losses"])


def test_a_notebook_todo_names_its_cell(tmp_path, capsys):
    notebook = tmp_path / "dynamic.ipynb"
    source = TODO_SCRIPT.read_text()
    document = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": source.splitlines(True)}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    notebook.write_text(json.dumps(document, indent=1))
    assert cli.main([str(notebook), "-o", str(tmp_path / "out.ipynb")]) == 1
    out = capsys.readouterr().out
    todo = next(line for line in out.splitlines() if line.startswith("  TODO "))
    assert todo.startswith(f"  TODO {tmp_path / 'out.ipynb'} cell 1 line ")
    line = int(todo.split(" line ")[1].split(":")[0])
    cell = json.loads((tmp_path / "out.ipynb").read_text())["cells"][0]["source"]
    assert cell[line - 1].startswith("# TODO(apexlite migrate): opt_level is chosen at run time")


def test_cells_joined_by_a_rewrite_are_refused_and_the_notebook_kept(tmp_path, capsys):
    """The forward pass in one cell and the loss in the next: one autocast block would span both cells."""
    cells = ["import torch\nfrom apex import amp\nmodel = torch.nn.Linear(2, 1)\n"
             "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "model, optimizer = amp.initialize(model, optimizer, opt_level='O1')",
             "output = model(torch.randn(4, 2))", "loss = output.pow(2).mean()",
             "with amp.scale_loss(loss, optimizer) as scaled:\n    scaled.backward()\noptimizer.step()"]
    document = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": text} for text in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    notebook = tmp_path / "split.ipynb"
    data = json.dumps(document, indent=1).encode()
    notebook.write_bytes(data)
    assert cli.main([str(notebook), "--in-place"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"apexlite migrate: {notebook}: the rewrite puts cell 3 inside a block that begins in cell 2 "
                          "(an autocast region spans them); join cells 2 to 3 into one and migrate again\n")
    assert notebook.read_bytes() == data


# --- input that is not Python ----------------------------------------------------------------------
@pytest.mark.parametrize("name,data,message", [
    ("undecodable.py", b"x = '\xe9\xff'\n", "is not Python source Python would run"),
    ("nul.py", b"x = 1\x00\n", "is not Python source"),
    ("outside.py", b"return 1\n", "'return' outside function"),
    ("notes.txt", b"Some notes, not code.\n", "check and migrate read Python scripts (.py) and Jupyter notebooks"),
    ("broken.ipynb", b"{\"cells\": [", "is not a Jupyter notebook (not JSON"),
])
def test_input_that_is_not_python_is_one_line_and_exit_2(tmp_path, capsys, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    assert cli.main([str(path)]) == 2
    assert message in one_line_error(capsys)


# --- symlinks and writing ------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_in_place_through_a_symlink_writes_its_target_and_keeps_the_link(tmp_path, capsys):
    target = tmp_path / "real" / "train.py"
    target.parent.mkdir()
    target.write_bytes(SCRIPT.read_bytes())
    target.chmod(0o640)
    link = tmp_path / "link.py"
    link.symlink_to(target)
    assert cli.main([str(link), "--in-place"]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == EXPECTED and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert f"{link} (a symlink: written to {target})" in capsys.readouterr().out
    assert sorted(p.name for p in target.parent.iterdir()) == ["train.py"]  # no temporary file left


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_folder_that_cannot_be_written_is_one_line_and_exit_3(tmp_path, capsys):
    folder = tmp_path / "readonly"
    folder.mkdir()
    script = folder / "train.py"
    script.write_bytes(SCRIPT.read_bytes())
    folder.chmod(0o555)
    try:
        assert cli.main([str(script), "--in-place"]) == 3
        assert "cannot create a file in" in one_line_error(capsys)
        assert script.read_bytes() == SCRIPT.read_bytes()
    finally:
        folder.chmod(0o755)


def test_a_folder_refusing_new_files_is_one_line_and_exit_3(tmp_path, capsys, monkeypatch):
    """What a read-only folder does to a non-root user, whoever runs the tests."""
    from apexlite.migrate import writing

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(writing.tempfile, "mkstemp", refused)
    script = tmp_path / "train.py"
    script.write_bytes(SCRIPT.read_bytes())
    assert cli.main([str(script), "--in-place"]) == 3
    assert one_line_error(capsys) == (f"apexlite migrate: cannot write {script}: cannot create a file in {tmp_path}: "
                                      "Permission denied; nothing written\n")
    assert script.read_bytes() == SCRIPT.read_bytes()


def test_a_full_disk_leaves_the_file_and_no_temporary(tmp_path, capsys, monkeypatch):
    from apexlite.migrate import writing

    def full(descriptor):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writing.os, "fsync", full)
    script = tmp_path / "train.py"
    script.write_bytes(SCRIPT.read_bytes())
    assert cli.main([str(script), "--in-place"]) == 3
    assert "No space left on device; it is unchanged" in one_line_error(capsys)
    assert script.read_bytes() == SCRIPT.read_bytes() and [p.name for p in tmp_path.iterdir()] == ["train.py"]


def test_a_destination_in_a_missing_folder_is_one_line_and_exit_3(tmp_path, capsys):
    assert cli.main([str(SCRIPT), "-o", str(tmp_path / "missing" / "out.py")]) == 3
    assert f"cannot create a file in {tmp_path / 'missing'}: No such file or directory" in one_line_error(capsys)


def test_an_output_folder_receives_the_script_under_its_name(tmp_path, capsys):
    assert cli.main([str(SCRIPT), "-o", str(tmp_path)]) == 0
    assert (tmp_path / SCRIPT.name).read_bytes() == EXPECTED


# --- folders and repositories --------------------------------------------------------------------
@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_bytes(SCRIPT.read_bytes())
    (root / "pkg" / "dynamic.py").write_bytes(TODO_SCRIPT.read_bytes())
    (root / "pkg" / "util.py").write_text("import os\n")
    (root / "pkg" / "py2.py").write_text("print 'python 2'\n")
    (root / "demo.ipynb").write_bytes((NOTEBOOKS / "amp_training.ipynb").read_bytes())
    (root / ".git").mkdir()
    (root / ".git" / "hook.py").write_text("from apex import amp\n")
    return root


def test_a_folder_without_an_output_mode_reports_and_writes_nothing(repo, capsys):
    before = {path: path.read_bytes() for path in repo.rglob("*") if path.is_file()}
    assert cli.main([str(repo)]) == 2  # the highest status: a file that is not Python
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[2:7]}
    assert rows == {str(repo / "demo.ipynb"): ["migrated", "0"], str(repo / "pkg" / "dynamic.py"): ["TODOs", "1"],
                    str(repo / "pkg" / "py2.py"): ["refused", "-"], str(repo / "pkg" / "util.py"): ["unchanged", "0"],
                    str(repo / "train.py"): ["migrated", "0"]}
    assert out.splitlines()[0] == ("apexlite migrate: 5 files: 2 migrated, 1 with TODOs (1 TODO), 1 unchanged, "
                                   "1 refused")
    assert f"  TODO {repo / 'pkg' / 'dynamic.py'}:" not in out and f"  TODO {repo / 'pkg' / 'dynamic.py'} line " in out
    assert "skipped: 1 folder (.git)" in out
    assert "run migrate again with --opt-level O1 (or the values you train with)" in out  # dynamic.py's run-time level
    assert out.rstrip().endswith("nothing written: add --in-place, -o OUTDIR or --diff")
    assert before == {path: path.read_bytes() for path in repo.rglob("*") if path.is_file()}


def test_a_folder_to_an_output_folder_keeps_the_tree(repo, tmp_path, capsys):
    out_dir = tmp_path / "migrated"
    assert cli.main([str(repo), "-o", str(out_dir), "--opt-level", "O1"]) == 2
    written = sorted(str(path.relative_to(out_dir)) for path in out_dir.rglob("*") if path.is_file())
    assert written == ["demo.ipynb", "pkg/dynamic.py", "pkg/util.py", "train.py"]  # not the refused file
    assert (out_dir / "train.py").read_bytes() == EXPECTED
    assert (out_dir / "pkg" / "util.py").read_bytes() == b"import os\n"
    assert b"from apex" not in (out_dir / "pkg" / "dynamic.py").read_bytes()  # --opt-level resolved it
    assert f"written under {out_dir}" in capsys.readouterr().out


def test_a_folder_in_place_rewrites_only_what_changes(repo, capsys):
    util = repo / "pkg" / "util.py"
    before = util.stat().st_mtime_ns
    (repo / "pkg" / "py2.py").unlink()
    assert cli.main([str(repo), "--in-place"]) == 1
    out = capsys.readouterr().out
    assert "3 files rewritten in place" in out
    assert (repo / "train.py").read_bytes() == EXPECTED and util.stat().st_mtime_ns == before
    assert "from apex import amp" not in "".join(json.loads((repo / "demo.ipynb").read_text())["cells"][1]["source"])
    assert (repo / ".git" / "hook.py").read_text() == "from apex import amp\n"


def test_a_folder_diff_prints_every_changed_file(repo, capsys):
    (repo / "pkg" / "py2.py").unlink()
    assert cli.main([str(repo), "--diff"]) == 1
    captured = capsys.readouterr()
    headers = [line for line in captured.out.splitlines() if line.startswith("+++ ")]
    assert headers == [f"+++ b/{repo / 'demo.ipynb'}", f"+++ b/{repo / 'pkg' / 'dynamic.py'}",
                       f"+++ b/{repo / 'train.py'}"]
    assert "# In[cell 3]" in captured.out  # a notebook diffs as its code cells
    assert "diffs printed; nothing written" in captured.err


def test_verify_takes_one_script(repo, capsys):
    assert cli.main([str(repo), "--verify"]) == 2
    assert "--verify runs one script" in one_line_error(capsys)


def test_an_output_file_for_several_inputs_is_refused(repo, tmp_path, capsys):
    (tmp_path / "out.py").write_text("")
    assert cli.main([str(repo), "-o", str(tmp_path / "out.py")]) == 2
    assert "-o names a folder" in one_line_error(capsys)


def test_exit_statuses_are_documented_in_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    words = " ".join(capsys.readouterr().out.split())  # help is wrapped to the terminal's width
    for code, meaning in cli.EXIT_STATUSES:
        assert f"{code} {meaning}" in words


@pytest.mark.slow
def test_verify_in_place_runs_the_original_before_it_is_overwritten(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # verify watches the current folder's files: not the checkout's
    script = tmp_path / "accumulate.py"
    script.write_bytes((ROOT / "examples" / "grad_accumulation_amp.py").read_bytes())
    status = cli.main([str(script), "--opt-level", "O1", "--in-place", "--verify", "--max-steps", "3", "--",
                       "--steps", "3"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "verify: original (apexlite run, O1): ok, 3 steps" in out and "verdict: AGREE" in out
    assert b"from apex" not in script.read_bytes()


def test_a_folders_todo_is_reported_where_its_comment_was_written(repo, tmp_path, capsys):
    """With -o, the report names the written file and the line of its TODO comment (it named the original's path
    with the written file's line, which pointed into unrelated code of a long file); without output, the original's
    path and line."""
    out_dir = tmp_path / "migrated"
    cli.main([str(repo), "-o", str(out_dir)])
    todo = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  TODO "))
    written = out_dir / "pkg" / "dynamic.py"
    assert todo.startswith(f"  TODO {written} line ")
    line = int(todo.split(" line ")[1].split(":")[0])
    assert written.read_text().splitlines()[line - 1].lstrip().startswith("# TODO(apexlite migrate): opt_level")
    cli.main([str(repo)])
    todo = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  TODO "))
    source_line = int(todo.split(" line ")[1].split(":")[0])
    assert "amp.initialize" in (repo / "pkg" / "dynamic.py").read_text().splitlines()[source_line - 1]
