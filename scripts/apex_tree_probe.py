"""Imports each of apex's modules python-only, each in its own forked process, and reports what it finds.

Run by scripts/gen_apex_tree.py under an interpreter with torch (and numpy) installed:
`python apex_tree_probe.py APEX_SRC [JOBS] < modules.json > report.json`. APEX_SRC is put first on sys.path
(apex's sources, no compiled extensions). torch is imported once up front; every module is then imported
in a fork of that process (JOBS forks at a time, default 4), so no import side effect (a half-initialised parent package, a patched torch)
leaks from one module into the next. The report maps each module to either
{"error": "<exception type>: <message>"} or {"names": {name: [kind, origin]}} for its attributes.
"""
from __future__ import annotations

import inspect
import json
import os
import selectors
import signal
import sys
import time
import types
from typing import Any, Dict, List, Optional, Tuple

_PRIMITIVES = (type(None), bool, int, float, complex, str, bytes)
_CHILD_TIMEOUT_S = 180


def runtime_kind(value: Any) -> List[Optional[str]]:
    """[kind, origin]: kind is module / class / function / object / constant; origin names where an apex
    class, function or module is defined (None when it is not apex's or has no stable name)."""
    if isinstance(value, types.ModuleType):
        return ["submodule", value.__name__]
    if isinstance(value, type):
        return ["class", f"{value.__module__}.{value.__qualname__}"]
    if inspect.isroutine(value) or type(value).__name__ == "partial":
        module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        return ["function", f"{module}.{qualname}" if module and qualname else None]
    if isinstance(value, _PRIMITIVES) or (isinstance(value, (tuple, list, frozenset, set, dict))
                                          and all(isinstance(v, _PRIMITIVES + (tuple,)) for v in value)):
        return ["constant", None]
    return ["object", None]


def _import_and_describe(module_name: str) -> Dict[str, Any]:
    import importlib
    import warnings

    warnings.simplefilter("ignore")
    try:
        module = importlib.import_module(module_name)
    except BaseException as error:  # noqa: BLE001 -- any failure means python-only apex refuses the module
        return {"error": f"{type(error).__name__}: {error}"}
    names = {}
    for name in dir(module):
        if name.startswith("__"):
            continue
        kind, origin = runtime_kind(getattr(module, name))
        names[name] = [kind, origin if origin and origin.split(".")[0] == "apex" else None]
    return {"names": names}


def _start_child(module_name: str) -> Tuple[int, int]:
    """Fork a child that imports `module_name` (stdout/stderr silenced) and writes its description to a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            payload = json.dumps(_import_and_describe(module_name)).encode()
        except BaseException as error:  # noqa: BLE001
            payload = json.dumps({"error": f"probe failed: {error!r}"}).encode()
        with os.fdopen(write_end, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write_end)
    return pid, read_end


def probe_all(modules: List[str], jobs: int) -> Dict[str, Dict[str, Any]]:
    """Describe every module, `jobs` forked children at a time (each read as it writes, so none blocks)."""
    selector = selectors.DefaultSelector()
    pending, report = list(modules), {}
    chunks: Dict[str, List[bytes]] = {}
    deadline: Dict[str, float] = {}
    while pending or chunks:
        while pending and len(chunks) < jobs:
            name = pending.pop(0)
            pid, fd = _start_child(name)
            chunks[name], deadline[name] = [], time.monotonic() + _CHILD_TIMEOUT_S
            selector.register(fd, selectors.EVENT_READ, (name, pid))
        for key, _ in selector.select(timeout=1.0):
            name, pid = key.data
            data = os.read(key.fd, 1 << 16)
            if data:
                chunks[name].append(data)
                continue
            selector.unregister(key.fd)
            os.close(key.fd)
            os.waitpid(pid, 0)
            raw = b"".join(chunks.pop(name))
            report[name] = json.loads(raw) if raw else {"error": "probe failed: no report (the import crashed or ran past the time limit)"}
        for key in list(selector.get_map().values()):
            name, pid = key.data
            if time.monotonic() > deadline[name]:
                os.kill(pid, signal.SIGKILL)
    return report


def main(argv: List[str]) -> int:
    sys.path.insert(0, os.path.abspath(argv[1]))
    import torch  # noqa: F401  (imported once, before the forks)

    modules = json.load(sys.stdin)
    report = probe_all(modules, int(argv[2]) if len(argv) > 2 else 4)
    report["__environment__"] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    json.dump(report, sys.stdout, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
