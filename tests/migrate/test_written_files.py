"""What a verify run wrote: files created (removed afterwards) and files changed, under the watched folders."""
from apexlite.migrate import written_files


def _write(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_created_and_changed_files_are_told_apart(tmp_path):
    kept = _write(tmp_path / "data.txt")
    changed = _write(tmp_path / "resume.pt", "old")
    before = written_files.snapshot([tmp_path])
    _write(tmp_path / "runs" / "ckpt.pt")
    changed.write_text("newer, longer")
    _write(tmp_path / ".cache" / "hidden.bin")  # hidden folders are not watched
    _write(tmp_path / "__pycache__" / "x.pyc")
    _write(tmp_path / f"{written_files.OWN_PREFIX}abc.py")  # verify's own copy of the migrated script
    written = written_files.written_since(before, [tmp_path, str(tmp_path) + "/."])
    assert written.created == [str(tmp_path / "runs" / "ckpt.pt")]
    assert written.changed == [str(changed)]
    written_files.remove_created(written)
    assert not (tmp_path / "runs" / "ckpt.pt").exists() and kept.exists() and changed.exists()


def test_too_many_files_are_not_watched(tmp_path, monkeypatch):
    monkeypatch.setattr(written_files, "MAX_FILES", 3)
    for index in range(4):
        _write(tmp_path / f"f{index}")
    before = written_files.snapshot([tmp_path])
    assert not before.complete
    _write(tmp_path / "new")
    assert written_files.written_since(before, [tmp_path]) == written_files.Written()


def test_describe_names_the_files_relative_to_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    created = [str(tmp_path / f"c{index}.pt") for index in range(7)]
    lines = written_files.describe("original", written_files.Written(created, [str(tmp_path / "resume.pt")]), True)
    assert lines == [
        "the original run created c0.pt, c1.pt, c2.pt, c3.pt, c4.pt and 2 more; removed, so that the next run starts "
        "from the same files",
        "the original run changed resume.pt, which existed before it: the next run reads the changed file(s) (a "
        "checkpoint it resumes from, say), and verify cannot put them back"]
    assert written_files.describe("migrated", written_files.Written(["/elsewhere/x.pt"], ["/elsewhere/y.pt"]),
                                  False) == [
        "the migrated run created /elsewhere/x.pt; removed, verify leaves nothing behind",
        "the migrated run changed /elsewhere/y.pt, which existed before it: verify cannot put them back"]
    assert written_files.describe("migrated", written_files.Written(), False) == []
