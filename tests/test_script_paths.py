"""apexlite.script_paths: which files `check PATH...` and `migrate PATH...` read in a folder, how symlinks
are treated, and where `-o OUTDIR` puts each one."""
import os
from pathlib import Path

import pytest

from apexlite.script_paths import collect, output_path, skipped_summary


def touch(path, text="x = 1\n"):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    for name in ["train.py", "pkg/model.py", "pkg/__init__.py", "notebooks/demo.ipynb", "README.md", "setup.cfg",
                 ".git/hooks/pre-commit.py", ".venv/lib/site.py", "env/pyvenv.cfg", "env/lib/x.py",
                 "build/lib/pkg/model.py", "dist/old.py", "pkg/__pycache__/model.py", "conda/conda-meta/x.py",
                 "src/site-packages/dep.py", "envs/cartpole.py"]:
        touch(root / name)
    return root


def test_walk_takes_sources_and_skips_environments_and_build_output(repo):
    found = collect([str(repo)])
    assert [os.path.relpath(target.path, repo) for target in found.targets] == [
        "envs/cartpole.py", "notebooks/demo.ipynb", "pkg/__init__.py", "pkg/model.py", "train.py"]
    assert found.several and found.folders == [str(repo)]
    skipped = sorted(os.path.relpath(path, repo) for path in found.skipped_folders)
    assert skipped == [".git", ".venv", "build", "conda", "dist", "env", "pkg/__pycache__", "src/site-packages"]
    assert skipped_summary(found).startswith("skipped: 8 folders (.git, .venv, __pycache__, build, conda, dist, "
                                             "env, site-packages)")


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_symlinks_in_a_folder(repo, tmp_path):
    outside = touch(tmp_path / "elsewhere" / "shared.py")
    (repo / "link_inside.py").symlink_to(repo / "train.py")
    (repo / "link_outside.py").symlink_to(outside)
    (repo / "broken.py").symlink_to(tmp_path / "missing.py")
    (repo / "linked_folder").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    found = collect([str(repo)])
    names = [os.path.relpath(target.path, repo) for target in found.targets]
    assert "train.py" not in names or "link_inside.py" not in names  # one real file, taken once
    assert sum(target.real == str((repo / "train.py").resolve()) for target in found.targets) == 1
    assert "link_outside.py" not in names and "broken.py" not in names
    assert not any(name.startswith("linked_folder") for name in names)
    text = " ".join(found.skipped_links)
    assert "link_outside.py (a symlink to" in text and "outside the folders given" in text
    assert "broken.py (a broken symlink)" in text and "linked_folder (a symlinked folder: not entered)" in text


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_a_file_named_is_followed_through_its_link(tmp_path):
    target = touch(tmp_path / "real" / "train.py")
    link = tmp_path / "link.py"
    link.symlink_to(target)
    found = collect([str(link)])
    assert not found.several
    assert found.targets[0].path == str(link) and found.targets[0].real == str(target.resolve())
    assert found.targets[0].link


def test_missing_paths_stay_targets_so_reading_them_says_why(tmp_path):
    found = collect([str(tmp_path / "missing.py")])
    assert [target.path for target in found.targets] == [str(tmp_path / "missing.py")]


def test_output_paths_keep_the_tree_and_never_collide(tmp_path):
    one = touch(tmp_path / "a" / "train.py")
    two = touch(tmp_path / "b" / "train.py")
    nested = touch(tmp_path / "a" / "pkg" / "m.py")
    found = collect([str(tmp_path / "a")])
    assert sorted(output_path(t, "/out", found) for t in found.targets) == ["/out/pkg/m.py", "/out/train.py"]
    found = collect([str(one), str(two)])
    assert [output_path(t, "/out", found) for t in found.targets] == ["/out/a/train.py", "/out/b/train.py"]
    found = collect([str(tmp_path / "a"), str(two)])
    assert sorted(output_path(t, "/out", found) for t in found.targets) == [
        "/out/a/pkg/m.py", "/out/a/train.py", "/out/b/train.py"]
    assert nested.exists()
