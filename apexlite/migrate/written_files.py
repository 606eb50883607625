"""The files `migrate --verify` runs write where the script lives and where it runs.

A script that saves a checkpoint and resumes from it when one exists would hand the original run's
checkpoint to the migrated run, which would then start from trained weights and differ for that reason
alone. So before each run, the files earlier runs of this verification created are held aside (renamed
into a hidden folder of the same root, nothing copied, nothing deleted), and each run starts from the
files that were there before the verification. At the end each held file whose path no later run wrote
again is put back, so the folders end as running the scripts one after the other leaves them. Files a
run changed that existed before are named (verify cannot hold those aside).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

SKIPPED_FOLDERS = frozenset({"__pycache__", "node_modules", "site-packages", "venv", "env"})
MAX_FILES = 50_000  # beyond this many files the folders are not watched (a data set, a home folder)
OWN_PREFIX = ".apexlite-"  # verify's own files and folders (the migrated script's copy, the held files)


@dataclass
class Snapshot:
    """Each watched file's (modification time, size); `complete` is False when the folders held too many."""

    files: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    complete: bool = True


def snapshot(roots: Iterable[str]) -> Snapshot:
    """Every file under `roots` (hidden folders, environments and caches left out)."""
    taken = Snapshot()
    for root in sorted(set(roots)):
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


def _shown(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _names(paths: List[str], shown: int = 5) -> str:
    listed = ", ".join(_shown(path) for path in paths[:shown])
    return listed + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


class WrittenFiles:
    """Watches `roots` over the runs of one verification: `before_run` holds aside what earlier runs created,
    `after_run` says what the run wrote, `restore` puts the held files back."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = sorted({os.path.realpath(root) for root in roots}, key=len, reverse=True)
        self.initial = snapshot(self.roots)
        self.complete = self.initial.complete
        self.held: Dict[str, str] = {}  # path -> where its latest version is held
        self._before: Optional[Snapshot] = None
        self._folders: Dict[str, str] = {}  # root -> its hidden folder of held files

    def _hold_folder(self, path: str) -> Tuple[str, str]:
        root = next(root for root in self.roots if path.startswith(root + os.sep))
        if root not in self._folders:
            self._folders[root] = os.path.join(root, f"{OWN_PREFIX}verify-held-{os.getpid()}")
        return self._folders[root], os.path.relpath(path, root)

    def before_run(self) -> None:
        """Hold aside every file created since the verification began."""
        if not self.complete:
            return
        current = snapshot(self.roots)
        for path in sorted(set(current.files) - set(self.initial.files)):
            folder, relative = self._hold_folder(path)
            target = os.path.join(folder, str(len(self.held)), relative)
            try:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.rename(path, target)
            except OSError:
                continue
            if path in self.held:
                os.unlink(self.held[path])  # an earlier run's version of the same file: the later one is kept
            self.held[path] = target
        self._before = snapshot(self.roots)

    def after_run(self, label: str, later_run: bool) -> List[str]:
        """verify's notes on what the run `label` created and changed (none when it wrote nothing)."""
        if not self.complete or self._before is None:
            return []
        after = snapshot(self.roots)
        if not after.complete:
            return []
        before = self._before.files
        created = sorted(path for path in after.files if path not in before)
        changed = sorted(path for path, seen in after.files.items() if path in before and before[path] != seen)
        lines = []
        if created:
            held = "; held aside while the next run ran, so that it started from the same files" if later_run else ""
            lines.append(f"the {label} run created {_names(created)}{held}")
        if changed:
            effect = "the next run read the changed file(s) (a checkpoint it resumes from, say), and " if later_run \
                else ""
            lines.append(f"the {label} run changed {_names(changed)}, which existed before it: {effect}verify "
                         "cannot hold those aside")
        return lines

    def restore(self) -> None:
        """Put back each held file whose path no later run wrote, and remove the emptied hidden folders."""
        for path, target in self.held.items():
            try:
                if os.path.lexists(path):
                    os.unlink(target)
                else:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    os.rename(target, path)
            except OSError:
                continue
        self.held.clear()
        for folder in self._folders.values():  # emptied folders only: a file that could not go back stays
            for current, _, _ in os.walk(folder, topdown=False):
                try:
                    os.rmdir(current)
                except OSError:
                    pass
