"""Running a file, a folder or a zip archive as `__main__` the way `python PATH` runs it.

What the script sees matches the interpreter's own start-up (CPython 3.9+): `__file__` is absolute (the
working folder joined to the path as given, not normalised; a relative one would break
`os.path.dirname(__file__)` after `os.chdir`), `sys.path[0]` the script's folder with symlinks resolved, code
objects carry the absolute path (so tracebacks name it), and for a plain file `__spec__` and `__package__` are
None with a SourceFileLoader as `__loader__`. A folder or zip archive runs its `__main__.py`, found through
the import system with a spec named `__main__`, as Python does. `sys.argv[0]` stays the path as given.
runpy.run_path differs in the first and last of these, so it is not used here.
"""
from __future__ import annotations

import builtins
import importlib.machinery
import io
import os
import pkgutil
import sys
import types
from typing import Any, Optional, Tuple


class MainNotFound(ImportError):
    """A folder or zip archive without a `__main__.py`."""


def search_path_entry(path: str) -> str:
    """What `python PATH` puts first on `sys.path`: the folder or archive itself, else the script's folder
    (symlinks resolved, so a linked script imports the modules beside its target)."""
    if _is_path_entry(path):
        return _absolute(path)
    return os.path.dirname(os.path.realpath(path))


def _absolute(path: str) -> str:
    """The path joined to the working folder as the interpreter joins it: `./a/../b.py` is not normalised."""
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def _is_path_entry(path: str) -> bool:
    """True for a folder or zip archive: something the import system can search for `__main__`."""
    return pkgutil.get_importer(_absolute(path)) is not None


def _file_namespace(absolute: str, compiled: bool) -> dict:
    loader_type = importlib.machinery.SourcelessFileLoader if compiled else importlib.machinery.SourceFileLoader
    return {"__name__": "__main__", "__doc__": None, "__file__": absolute, "__cached__": None,
            "__loader__": loader_type("__main__", absolute), "__spec__": None, "__package__": None,
            "__builtins__": builtins}


def _read_file_code(absolute: str) -> Tuple[Any, bool]:
    """(code, compiled): a .pyc's code object, else the source compiled under the absolute path (a
    SyntaxError is raised as Python raises it)."""
    with io.open_code(absolute) as handle:
        code = pkgutil.read_code(handle)
    if code is not None:
        return code, True
    with io.open_code(absolute) as handle:
        return compile(handle.read(), absolute, "exec", dont_inherit=True), False


def _entry_namespace_and_code(entry: str) -> Tuple[dict, Any]:
    """(namespace, code) of `entry`'s `__main__.py`, found as the interpreter finds it."""
    spec = importlib.machinery.PathFinder.find_spec("__main__", [entry])
    if spec is None or spec.loader is None:
        raise MainNotFound(f"can't find '__main__' module in {entry!r}")
    namespace = {"__name__": "__main__", "__doc__": None, "__file__": spec.origin, "__cached__": spec.cached,
                 "__loader__": spec.loader, "__spec__": spec, "__package__": "", "__builtins__": builtins}
    return namespace, spec.loader.get_code("__main__")


def load_main(path: str) -> Tuple[dict, Any]:
    """(namespace, code) for running `path` as `__main__`; raises what Python would (SyntaxError, OSError,
    MainNotFound) before any of the script runs."""
    if _is_path_entry(path):
        return _entry_namespace_and_code(_absolute(path))
    absolute = _absolute(path)
    code, compiled = _read_file_code(absolute)
    return _file_namespace(absolute, compiled), code


def load_source_main(source: str, filename: str) -> Tuple[dict, Any]:
    """(namespace, code) for source given on the command line (`-c`, filename "<string>") or read from stdin
    (`-`, "<stdin>"), as the interpreter runs it: the built-in importer as `__loader__`, and `__file__` (with
    `__cached__` None) only for stdin."""
    namespace = {"__name__": "__main__", "__doc__": None, "__loader__": importlib.machinery.BuiltinImporter,
                 "__spec__": None, "__package__": None, "__builtins__": builtins, "__annotations__": {}}
    if filename == "<stdin>":
        namespace.update(__file__=filename, __cached__=None)
    return namespace, compile(source, filename, "exec", dont_inherit=True)


def execute_main(namespace: dict, code: Any) -> None:
    """Run `code` in a fresh `__main__` module that is sys.modules['__main__'] while it runs (pickle and
    multiprocessing look classes up there); the module that was there before is put back afterwards."""
    module = types.ModuleType("__main__")
    module.__dict__.update(namespace)
    saved: Optional[types.ModuleType] = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved
