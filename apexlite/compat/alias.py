"""`python -m apexlite alias install|uninstall|status`: apexlite as `apex` for a whole Python environment.

`install` writes, into the site-packages of the Python that runs it (its `sys.prefix`), stand-in
packages `apex/`, `amp_C/` and one for each other top-level module of apex that apexlite implements
(`fused_layer_norm_cuda/`, `syncbn/`, ...), and an `apex` distribution (`apex-0.1+apexlite.dist-info`, so
`importlib.metadata.version("apex")` and pip see it). Every interpreter of that environment, and
every process any of them starts, then resolves `import apex` / `import amp_C` / ... to apexlite: the
stand-in hands the import to apexlite's import hook (hook.replace_stand_in, as child_path's
stand-ins do). Nothing runs at interpreter start-up, so start-up costs nothing (BENCHMARKS.md).
It refuses where a real apex is installed. What it wrote is recorded (with hashes) in the
dist-info, and `uninstall` removes exactly that; `pip uninstall apex` works too (RECORD).
"""
from __future__ import annotations

import base64
import hashlib
import importlib.machinery
import importlib.metadata
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from apexlite.compat.child_path import CHILD_PATH
from apexlite.compat.child_path.sitecustomize import ALIAS_DIST_INFO as DIST_INFO
from apexlite.compat.child_path.sitecustomize import APEX_DISTRIBUTION_VERSION, LEGACY_TOP_LEVEL
from apexlite.compat.install import is_stand_in
from apexlite.help_text import wrap
from apexlite.switches import help_section
RECORD_NAME = "apexlite_alias.json"  # apexlite's own record of what install wrote, inside the dist-info
USAGE = """usage: python -m apexlite alias install|uninstall|status

Makes every Python of this environment ({prefix}) resolve `import apex`, `import amp_C` and apex's other
top-level modules apexlite implements ({modules}) to apexlite, with an `apex` distribution
({version}) in importlib.metadata and pip:
  install    write stand-in packages for those modules and the apex dist-info into {site}
             (refused when a real apex is installed here)
  uninstall  remove exactly what install wrote
  status     say what is there and where `import apex` goes; exit status 0 when the alias is in place"""

STAND_IN = '''"""`{name}` here is apexlite's alias (`python -m apexlite alias install`): the import goes to apexlite.

Remove it with `python -m apexlite alias uninstall` (or `pip uninstall apex`).
"""
try:
    from apexlite.compat import hook
except ImportError as error:
    raise ImportError("`{name}` in this environment is apexlite's alias (python -m apexlite alias install), but "
                      "apexlite cannot be imported: reinstall apexlite, or remove the alias with "
                      "`pip uninstall apex`.") from error

hook.replace_stand_in(__name__)
'''
METADATA = (f"Metadata-Version: 2.1\nName: apex\nVersion: {APEX_DISTRIBUTION_VERSION}\n"
            "Summary: NVIDIA apex's legacy API provided by apexlite (python -m apexlite alias install)\n")


def site_dir() -> Path:
    """The site-packages directory of the running interpreter's environment."""
    return Path(sysconfig.get_paths()["purelib"])


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _planned_files() -> Dict[str, bytes]:
    """Relative path -> contents of everything install writes (RECORD is added from these)."""
    files = {f"{name}/__init__.py": STAND_IN.format(name=name).encode() for name in LEGACY_TOP_LEVEL}
    files.update({
        f"{DIST_INFO}/METADATA": METADATA.encode(),
        f"{DIST_INFO}/INSTALLER": b"apexlite\n",
        f"{DIST_INFO}/top_level.txt": ("\n".join(LEGACY_TOP_LEVEL) + "\n").encode(),
    })
    lines = []
    for path, data in files.items():
        encoded = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={encoded},{len(data)}")
    lines += [f"{DIST_INFO}/RECORD,,", f"{DIST_INFO}/{RECORD_NAME},,"]
    files[f"{DIST_INFO}/RECORD"] = ("\n".join(lines) + "\n").encode()
    return files


def _read_record(site: Path) -> Optional[dict]:
    try:
        return json.loads((site / DIST_INFO / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None


def _file_states(site: Path, record: dict) -> Dict[str, str]:
    """Each recorded file's state: "ok", "modified" or "missing"."""
    states = {}
    for path, digest in record["files"].items():
        try:
            states[path] = "ok" if _digest((site / path).read_bytes()) == digest else "modified"
        except OSError:
            states[path] = "missing"
    return states


def real_apex(site: Path) -> List[str]:
    """Where a real apex (or amp_C) is installed for this interpreter; apexlite's stand-ins do not count."""
    here = os.path.abspath(os.curdir)
    search = [entry for entry in sys.path
              if entry and os.path.abspath(entry) not in (here, CHILD_PATH)]
    found = []
    for name in LEGACY_TOP_LEVEL:
        spec = importlib.machinery.PathFinder.find_spec(name, search)
        origin = None if spec is None else (spec.origin or next(iter(spec.submodule_search_locations or []), None))
        if origin is not None and not is_stand_in(origin):
            found.append(f"{name} at {origin}")
    for dist in importlib.metadata.distributions(name="apex", path=search):
        if dist.version != APEX_DISTRIBUTION_VERSION:
            found.append(f"the apex {dist.version} distribution at {getattr(dist, '_path', '?')}")
    return found


def _write_all(site: Path, files: Dict[str, bytes]) -> None:
    """Write every file, or none: on an error, what was written is removed again."""
    written: List[Path] = []
    try:
        for path, data in files.items():
            target = site / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append(target)
        record = {"version": APEX_DISTRIBUTION_VERSION, "python": sys.executable,
                  "files": {path: _digest(data) for path, data in files.items()}}
        (site / DIST_INFO / RECORD_NAME).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    except BaseException:
        for target in written:
            target.unlink()
        _remove_empty_dirs(site)
        raise


def _remove_empty_dirs(site: Path) -> None:
    for directory in (*LEGACY_TOP_LEVEL, DIST_INFO):
        pycache = site / directory / "__pycache__"
        if pycache.is_dir():  # Python's byproducts of the stand-ins install wrote
            for compiled in pycache.glob("__init__.*.pyc"):
                compiled.unlink()
            if not any(pycache.iterdir()):
                pycache.rmdir()
        if (site / directory).is_dir() and not any((site / directory).iterdir()):
            (site / directory).rmdir()


def _missing_from(record: dict) -> List[str]:
    """What this apexlite's install writes that an alias installed by another version lacks or has otherwise."""
    recorded = record.get("files", {})
    return sorted(path for path, data in _planned_files().items()
                  if path.endswith("__init__.py") and recorded.get(path) != _digest(data))


def install(site: Path) -> Tuple[int, str]:
    """(exit status, message) of `alias install` (an intact alias written by another apexlite is replaced)."""
    record = _read_record(site)
    states = set(_file_states(site, record).values()) if record is not None else set()
    if states == {"ok"} and not _missing_from(record):
        return 0, f"apexlite alias already installed in {site}; nothing to do."
    if record is not None and "modified" not in states:
        # an older apexlite's alias, or what an uninstall left (files deleted since): its record and unchanged
        # files go first, so that its dist-info is not taken for a real apex
        uninstall(site)
    conflicts = real_apex(site)
    if conflicts:
        return 1, ("apexlite alias: refused, a real apex is installed in this environment: " + "; ".join(conflicts)
                   + ". The alias would shadow it for every Python here. Uninstall it first (pip uninstall apex), "
                   "or use apexlite per process: `python -m apexlite run SCRIPT` or `apexlite.install()`.")
    try:
        _write_all(site, _planned_files())
    except OSError as error:
        return 1, f"apexlite alias: could not write into {site}: {error}. Nothing was installed."
    return 0, (f"apexlite alias installed in {site}: `import apex`, `import amp_C`, apex's other top-level modules "
               f"and the apex distribution "
               f"({APEX_DISTRIBUTION_VERSION}) now resolve to apexlite for every Python of {sys.prefix}. "
               "Undo with `python -m apexlite alias uninstall`.")


def uninstall(site: Path) -> Tuple[int, str]:
    """(exit status, message) of `alias uninstall`: removes exactly the files install wrote, unmodified."""
    record = _read_record(site)
    if record is None:
        return 0, f"no apexlite alias in {site}; nothing to remove."
    kept = []
    for path, state in _file_states(site, record).items():
        if state == "ok":
            (site / path).unlink()
        elif state == "modified":
            kept.append(path)
    if not kept:
        (site / DIST_INFO / RECORD_NAME).unlink()
    _remove_empty_dirs(site)
    if kept:
        return 1, (f"apexlite alias: removed what was unchanged; kept {', '.join(kept)} in {site}, changed since "
                   "install (not what install wrote). Delete them yourself if they are not wanted; the alias's record "
                   f"({DIST_INFO}/{RECORD_NAME}) stays until `python -m apexlite alias uninstall` runs again after "
                   "that (or `alias install` writes the alias anew).")
    return 0, f"apexlite alias removed from {site}."


def status(site: Path) -> Tuple[int, str]:
    """(exit status, report) of `alias status`: 0 when the alias is installed, intact and effective."""
    record = _read_record(site)
    if record is None:
        conflicts = real_apex(site)
        where = f"; a real apex is installed: {'; '.join(conflicts)}" if conflicts else ""
        return 1, f"no apexlite alias in {site}{where}."
    states = _file_states(site, record)
    lines = [f"apexlite alias in {site} (apex {record.get('version')}):"]
    lines += [f"  {path}: {state}" for path, state in sorted(states.items())]
    missing = _missing_from(record)
    if missing:
        lines.append(f"  out of date (written by another apexlite): {', '.join(missing)} not as this apexlite "
                     "writes it; run `python -m apexlite alias install` again")
    conflicts = real_apex(site)
    if conflicts:
        lines.append("  shadowed: " + "; ".join(conflicts))
    healthy = set(states.values()) == {"ok"} and not conflicts and not missing
    lines.append("  `import apex` resolves to apexlite" if healthy else "  the alias is incomplete or shadowed")
    return (0 if healthy else 1), "\n".join(lines)


ACTIONS = {"install": install, "uninstall": uninstall, "status": status}


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite alias`."""
    site = site_dir()
    usage = wrap(USAGE.format(prefix=sys.prefix, version=APEX_DISTRIBUTION_VERSION, site=site,
                              modules=", ".join(LEGACY_TOP_LEVEL[2:])) + "\n\n" + help_section("alias"))
    if len(argv) != 1 or argv[0] not in ACTIONS:
        if argv and argv[0] in ("-h", "--help"):
            sys.stdout.write(usage + "\n")
            return 0
        sys.stderr.write(usage + "\n")
        return 2
    code, message = ACTIONS[argv[0]](site)
    (sys.stdout if code == 0 else sys.stderr).write(message + "\n")
    return code
