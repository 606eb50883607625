"""The files a `migrate --verify` run writes where the script lives and where it runs.

A script that saves a checkpoint and resumes from it when one exists would hand the original run's
checkpoint to the migrated run, which would then start from trained weights and differ for that reason
alone. So verify notes every file present before a run, and after it removes the files the run created
(verify leaves nothing behind) and names the files it changed (those it cannot put back).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Tuple

SKIPPED_FOLDERS = frozenset({"__pycache__", "node_modules", "site-packages", "venv", "env"})
MAX_FILES = 50_000  # beyond this many files the folders are not watched (a data set, a home folder)
OWN_PREFIX = ".apexlite-migrated-"  # verify's own copy of the migrated script


@dataclass
class Snapshot:
    """Each watched file's (modification time, size); `complete` is False when the folders held too many."""

    files: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    complete: bool = True


@dataclass
class Written:
    """What a run did to the watched folders: files it created and files that existed and changed."""

    created: List[str] = field(default_factory=list)
    changed: List[str] = field(default_factory=list)


def snapshot(roots: Iterable[str]) -> Snapshot:
    """Every file under `roots` (hidden folders, environments and caches left out)."""
    taken = Snapshot()
    for root in sorted({os.path.realpath(root) for root in roots}):
        for folder, folders, names in os.walk(root):
            folders[:] = [name for name in folders if not name.startswith(".") and name not in SKIPPED_FOLDERS]
            for name in names:
                if name.startswith(OWN_PREFIX):
                    continue
                path = os.path.join(folder, name)
                try:
                    stat = os.stat(path)
                except OSError:
                    continue
                taken.files[path] = (stat.st_mtime_ns, stat.st_size)
                if len(taken.files) > MAX_FILES:
                    return Snapshot(complete=False)
    return taken


def written_since(before: Snapshot, roots: Iterable[str]) -> Written:
    """The files created or changed under `roots` since `before` (nothing when either look was incomplete)."""
    after = snapshot(roots)
    if not (before.complete and after.complete):
        return Written()
    return Written(created=sorted(path for path in after.files if path not in before.files),
                   changed=sorted(path for path, seen in after.files.items()
                                  if path in before.files and before.files[path] != seen))


def remove_created(written: Written) -> None:
    """Delete the files the run created (empty folders it made stay)."""
    for path in written.created:
        try:
            os.unlink(path)
        except OSError:
            pass


def _shown(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def describe(label: str, written: Written, later_run: bool, shown: int = 5) -> List[str]:
    """verify's lines about what one run wrote (none when it wrote nothing); `later_run`: another run follows."""
    def names(paths: List[str]) -> str:
        listed = ", ".join(_shown(path) for path in paths[:shown])
        return listed + (f" and {len(paths) - shown} more" if len(paths) > shown else "")

    lines = []
    if written.created:
        why = "so that the next run starts from the same files" if later_run else "verify leaves nothing behind"
        lines.append(f"the {label} run created {names(written.created)}; removed, {why}")
    if written.changed:
        effect = "the next run reads the changed file(s) (a checkpoint it resumes from, say), and " if later_run else ""
        lines.append(f"the {label} run changed {names(written.changed)}, which existed before it: {effect}verify "
                     "cannot put them back")
    return lines
