"""The files `check PATH...` and `migrate PATH...` work on: the files named, and every Python file and
notebook under the folders named.

Walking a folder skips what is not the project's own source: hidden folders (.git, .venv, .tox,
.ipynb_checkpoints, ...), virtual environments (any folder holding pyvenv.cfg or conda-meta),
site-packages, node_modules, __pycache__, build and dist. Symlinks: a file named on the command line is
followed (so `--in-place` writes through a link to the file it points to and keeps the link); inside a
folder, a symlinked folder is not entered (no cycles, nothing outside the tree), a symlinked file is
taken once, under its real path, when that path is inside a folder given, and listed as skipped
otherwise. Everything skipped is counted, so a report can say what was left out.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set

from apexlite.wording import counted

SOURCE_SUFFIXES = (".py", ".ipynb")
SKIPPED_FOLDER_NAMES = frozenset({"__pycache__", "site-packages", "dist-packages", "node_modules", "build", "dist"})
ENVIRONMENT_MARKERS = ("pyvenv.cfg", "conda-meta")  # a folder holding one of these is an environment


@dataclass
class Target:
    """One file to work on: `path` as the user sees it, `real` the file read and written."""

    path: str
    real: str
    root: Optional[str] = None  # the folder argument it was found under (None: named itself)
    link: bool = False  # `path` is a symlink to `real`


@dataclass
class Collection:
    """The targets in order, and what the walk left out."""

    targets: List[Target] = field(default_factory=list)
    skipped_folders: List[str] = field(default_factory=list)
    skipped_links: List[str] = field(default_factory=list)  # symlinks not followed (reason in the text)
    folders: List[str] = field(default_factory=list)  # folder arguments

    @property
    def several(self) -> bool:
        """More than one file, or any folder: reports become a table."""
        return bool(self.folders) or len(self.targets) != 1


def _skipped_folder(parent: str, name: str) -> bool:
    if name.startswith(".") or name in SKIPPED_FOLDER_NAMES or name.endswith(".egg-info"):
        return True
    return any(os.path.exists(os.path.join(parent, name, marker)) for marker in ENVIRONMENT_MARKERS)


def _inside(real: str, roots: Sequence[str]) -> bool:
    return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _walk(folder: str, real_roots: Sequence[str], seen: Set[str], found: Collection) -> None:
    """Append the folder's sources, sorted by path, to `found`."""
    start = len(found.targets)
    for parent, folders, files in os.walk(folder):
        kept = []
        for name in sorted(folders):
            path = os.path.join(parent, name)
            if os.path.islink(path):
                found.skipped_links.append(f"{path} (a symlinked folder: not entered)")
            elif _skipped_folder(parent, name):
                found.skipped_folders.append(path)
            else:
                kept.append(name)
        folders[:] = kept
        for name in sorted(files):
            if not name.lower().endswith(SOURCE_SUFFIXES):
                continue
            path = os.path.join(parent, name)
            real = os.path.realpath(path)
            link = os.path.islink(path)
            if link and not os.path.exists(real):
                found.skipped_links.append(f"{path} (a broken symlink)")
            elif link and not _inside(real, real_roots):
                found.skipped_links.append(f"{path} (a symlink to {real}, outside the folders given: name it to "
                                           "include it)")
            elif real not in seen:
                seen.add(real)
                found.targets.append(Target(path, real, folder, link))
    found.targets[start:] = sorted(found.targets[start:], key=lambda target: target.path.split(os.sep))


def collect(paths: Sequence[str]) -> Collection:
    """The targets of `paths` in the order given (each folder's files sorted), each real file once.
    A path that does not exist, or is neither a folder nor a file, is still a target: reading it gives
    the user its one-line error."""
    found = Collection()
    real_roots = [os.path.realpath(path) for path in paths if os.path.isdir(path)]
    seen: Set[str] = set()
    for path in paths:
        if os.path.isdir(path):
            found.folders.append(path)
            _walk(path, real_roots, seen, found)
        else:
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                found.targets.append(Target(path, real, None, os.path.islink(path)))
    return found


def skipped_summary(found: Collection) -> Optional[str]:
    """`skipped: 2 folders (.git, venv), 1 symlink` or None when nothing was left out."""
    parts = []
    if found.skipped_folders:
        names: Dict[str, int] = {}
        for path in found.skipped_folders:
            base = os.path.basename(path)
            names[base] = names.get(base, 0) + 1
        listed = ", ".join(name if count == 1 else f"{name} x{count}" for name, count in sorted(names.items()))
        parts.append(f"{counted(len(found.skipped_folders), 'folder')} ({listed})")
    if found.skipped_links:
        parts.append(f"{counted(len(found.skipped_links), 'symlink')}: " + "; ".join(found.skipped_links))
    return "skipped: " + ", ".join(parts) if parts else None


def output_path(target: Target, out_dir: str, collection: Collection) -> str:
    """Where `-o OUTDIR` puts `target`: its path relative to the folder that holds every argument (the
    folder itself when one folder was given), so the tree is kept and names never collide."""
    bases = [os.path.abspath(folder) for folder in collection.folders]
    bases += [os.path.dirname(os.path.abspath(t.path)) for t in collection.targets if t.root is None]
    return os.path.join(out_dir, os.path.relpath(os.path.abspath(target.path), os.path.commonpath(bases)))
