"""What verify's runs write: files an earlier run created are held aside before each run (renamed, never
deleted) and put back at the end unless a later run wrote the same path; changed files are named."""
import os

from apexlite.migrate import written_files


def _write(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _files(root):
    return sorted(os.path.relpath(os.path.join(folder, name), root) for folder, _, names in os.walk(root)
                  for name in names)


def test_each_run_starts_from_the_files_there_before(tmp_path):
    _write(tmp_path / "data.txt")
    changed = _write(tmp_path / "config.json", "old")
    (tmp_path / "runs").mkdir()  # an empty folder the script writes into: it must stay while files are held
    watched = written_files.WrittenFiles([tmp_path])
    watched.before_run()
    _write(tmp_path / "runs" / "ckpt.pt", "original's")
    _write(tmp_path / "only_original.log", "log")
    changed.write_text("newer, longer")
    _write(tmp_path / ".cache" / "hidden.bin")  # hidden folders are not watched
    _write(tmp_path / "__pycache__" / "x.pyc")
    notes = watched.after_run("original", later_run=True)
    assert notes == [
        f"the original run created {tmp_path / 'only_original.log'}, {tmp_path / 'runs' / 'ckpt.pt'}; held aside "
        "while the next run ran, so that it started from the same files",
        f"the original run changed {tmp_path / 'config.json'}, which existed before it: the next run read the changed "
        "file(s) (a checkpoint it resumes from, say), and verify cannot hold those aside"]
    watched.before_run()
    assert not (tmp_path / "runs" / "ckpt.pt").exists() and (tmp_path / "runs").is_dir()
    assert not (tmp_path / "only_original.log").exists()
    _write(tmp_path / "runs" / "ckpt.pt", "migrated's")
    assert watched.after_run("migrated", later_run=False) == [
        f"the migrated run created {tmp_path / 'runs' / 'ckpt.pt'}"]
    watched.restore()
    assert (tmp_path / "runs" / "ckpt.pt").read_text() == "migrated's"  # the later run's, as running both leaves it
    assert (tmp_path / "only_original.log").read_text() == "log"  # put back
    assert _files(tmp_path) == [".cache/hidden.bin", "__pycache__/x.pyc", "config.json", "data.txt",
                                "only_original.log", "runs/ckpt.pt"]


def test_a_file_made_elsewhere_during_a_run_is_held_and_put_back(tmp_path):
    watched = written_files.WrittenFiles([tmp_path, tmp_path / "sub"])
    watched.before_run()
    _write(tmp_path / "sub" / "notes.txt", "mine")
    watched.after_run("original", later_run=True)
    watched.before_run()
    assert not (tmp_path / "sub" / "notes.txt").exists()
    watched.restore()
    assert (tmp_path / "sub" / "notes.txt").read_text() == "mine"
    assert _files(tmp_path) == ["sub/notes.txt"]


def test_too_many_files_are_not_watched(tmp_path, monkeypatch):
    monkeypatch.setattr(written_files, "MAX_FILES", 3)
    for index in range(4):
        _write(tmp_path / f"f{index}")
    watched = written_files.WrittenFiles([tmp_path])
    assert not watched.complete
    watched.before_run()
    _write(tmp_path / "new")
    assert watched.after_run("original", later_run=True) == []
    watched.before_run()
    assert (tmp_path / "new").exists()


def test_names_are_shown_relative_to_here_and_cut_after_five(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    watched = written_files.WrittenFiles([tmp_path])
    watched.before_run()
    for index in range(7):
        _write(tmp_path / f"c{index}.pt")
    assert watched.after_run("migrated", later_run=False) == [
        "the migrated run created c0.pt, c1.pt, c2.pt, c3.pt, c4.pt and 2 more"]
