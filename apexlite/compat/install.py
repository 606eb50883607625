"""`apexlite.install()`: the way in for notebooks and for scripts that a launcher starts.

It does for the calling process what `python -m apexlite run` does around a script, with the same
machinery (the import hook of hook.py and the start-up folder of child_path), and leaves it on:
the process keeps the hook, and the processes it starts from then on get `child_path` through
`PYTHONPATH`, whose `sitecustomize` installs the hook at their start-up (multiprocessing spawn and
forkserver children, torch.multiprocessing.spawn, spawn DataLoader workers, subprocess Pythons).
Forked children inherit the hook with the rest of the process.
"""
from __future__ import annotations

import importlib.machinery
import os
import sys
from typing import List, Optional

from apexlite._logging import get_logger
from apexlite.compat import hook
from apexlite.compat.child_path import CHILD_PATH

log = get_logger("install")


def _imported_elsewhere() -> List[str]:
    """Legacy top-level modules already imported from somewhere other than apexlite (e.g. a real apex)."""
    found = []
    for name in hook.TOP_LEVEL:
        module = sys.modules.get(name)
        if module is not None and not getattr(module, "__name__", "").startswith(hook.COMPAT_PACKAGE):
            found.append(f"{name} ({getattr(module, '__file__', None) or 'no file'})")
    return found


def _real_apex_location() -> Optional[str]:
    """Where an importable `apex` other than apexlite's stand-ins lives on sys.path, if anywhere."""
    search = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != CHILD_PATH]
    spec = importlib.machinery.PathFinder.find_spec("apex", search)
    if spec is None:
        return None
    origin = spec.origin or next(iter(spec.submodule_search_locations or []), None)
    return None if origin is None or is_stand_in(origin) else origin


def is_stand_in(path: str) -> bool:
    """Whether the module file at `path` is one of apexlite's stand-ins (child_path's or the alias's)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "hook.replace_stand_in(" in handle.read(4096)
    except OSError:
        return False


def install() -> None:
    """Make `import apex`, `import amp_C` and apex's other top-level modules (`fused_layer_norm_cuda`, ...)
    resolve to apexlite here and in every process started after.

    Call it once, before anything imports apex: in a notebook's first cell, or at the top of a script
    that a launcher (accelerate, deepspeed, torchrun, Ray or SLURM workers) starts. It puts apexlite's
    import hook first on `sys.meta_path` (so an installed NVIDIA apex is shadowed in this process) and
    child_path first on `PYTHONPATH` (and on `sys.path`, for children that skip site), so new Python
    processes install the same hook at start-up. `importlib.metadata` then reports an `apex`
    distribution (0.1+apexlite). Idempotent: a second call changes nothing. Logs one INFO line.

    Raises RuntimeError when `apex` or one of those modules was already imported from elsewhere in this
    process: those objects cannot be swapped for apexlite's afterwards.
    """
    elsewhere = _imported_elsewhere()
    if elsewhere:
        raise RuntimeError(
            f"apexlite.install() must run before apex is imported, but {', '.join(elsewhere)} is already "
            "imported in this process. Call apexlite.install() first (a notebook's first cell, the top of the "
            "script), or restart the kernel/interpreter and call it before anything imports apex."
        )
    # a child started by an installed parent already has child_path first on PYTHONPATH: install quietly
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] == CHILD_PATH
    changed = _put_hook_first()
    if CHILD_PATH not in sys.path:
        sys.path.insert(1 if sys.path else 0, CHILD_PATH)
        changed = True
    pythonpath = os.environ.get("PYTHONPATH", "")
    if CHILD_PATH not in pythonpath.split(os.pathsep):
        os.environ["PYTHONPATH"] = CHILD_PATH + (os.pathsep + pythonpath if pythonpath else "")
        changed = True
    if not changed or inherited:
        log.debug("apexlite.install(): already installed in this process or inherited from its parent")
        return
    shadowed = _real_apex_location()
    log.info("apexlite.install(): `import apex`, `import amp_C` and apex's other top-level modules now resolve to "
             "apexlite in this process and in the Python processes it starts%s",
             f" (shadowing the apex at {shadowed})" if shadowed else "")


def _put_hook_first() -> bool:
    """Install the hook, or move apexlite's finder to the front; True when sys.meta_path changed."""
    had_finder = any(isinstance(finder, hook.ApexAliasFinder) for finder in sys.meta_path)
    finder = hook.ensure_installed()
    if sys.meta_path[0] is finder:
        return not had_finder
    sys.meta_path.remove(finder)
    sys.meta_path.insert(0, finder)
    return True
