"""`python -m apexlite run SCRIPT [ARGS...]` / `run -m MODULE [ARGS...]`: a legacy apex script, unchanged.

The script runs in this process exactly as `python SCRIPT ARGS...` would run it (`__name__` is
"__main__", `sys.argv` is [SCRIPT, *ARGS], an absolute `__file__`, `sys.path[0]`, `__spec__` and
tracebacks as the interpreter sets them: apexlite.script_main; its exit code is the process's), with the
apex import hook installed first so `import apex` and `import amp_C` resolve to apexlite.compat.
APEXLITE_OPT_LEVEL / APEXLITE_DTYPE in the environment are honoured by `amp.initialize`, so the opt level
or dtype can change without editing the script.
When `main()` returns (or raises), `sys.argv`, `sys.path` and `PYTHONPATH` are as it found them and
the hook is off `sys.meta_path` again, so a run can be embedded in another Python program. A script that
ended normally gets one thing more at interpreter exit: a gloo process group it left alive is destroyed
before shutdown (apexlite.gloo_exit), where torch's gloo threads could otherwise abort the finished process.
"""
from __future__ import annotations

import contextlib
import os
import runpy
import sys
from types import TracebackType
from typing import Iterator, List, Optional

from apexlite._logging import get_logger
from apexlite.amp import layer_precision
from apexlite.compat import hook
from apexlite.compat.child_path import CHILD_PATH
from apexlite.gloo_exit import GlooRelease
from apexlite.help_text import wrap
from apexlite.script_main import MainNotFound, execute_main, load_main, load_source_main, search_path_entry
from apexlite.script_program import looks_like_notebook
from apexlite.switches import help_section

log = get_logger("runner")

USAGE = """usage: python -m apexlite run SCRIPT [ARGS...]
       python -m apexlite run -m MODULE [ARGS...]
       python -m apexlite run -c CODE [ARGS...]
       python -m apexlite run - [ARGS...]        (the script read from stdin)

Runs a legacy apex script unchanged: `import apex` / `from apex import amp` / `import amp_C` resolve to
apexlite, in the script and in the Python processes it starts that inherit its environment (the hook
travels in PYTHONPATH: a child given a fresh environment, or run with `python -I`, does not get it; the
alias command installs it for every process of a venv), and importlib.metadata reports an `apex`
distribution (version 0.1+apexlite) so libraries that check for apex find it. The script sees what
`python SCRIPT` shows it: sys.argv, an absolute __file__, sys.path[0], __spec__, its tracebacks."""


def _user_frames(tb: Optional[TracebackType], origin: Optional[str]) -> Optional[TracebackType]:
    """Drop the runner's own frames so the traceback starts where `python SCRIPT` would start it."""
    if origin is None:
        return tb
    origin = os.path.realpath(origin)
    current = tb
    while current is not None:
        if os.path.realpath(current.tb_frame.f_code.co_filename) == origin:
            return current
        current = current.tb_next
    return tb


INTERRUPTED_STATUS = 130  # 128 + SIGINT: what a shell reports for `python SCRIPT` ended by Ctrl-C


def _report_exception(error: BaseException, origin: Optional[str]) -> int:
    """Print the traceback through sys.excepthook (as the interpreter does); exit status 1, or 130 for a
    KeyboardInterrupt."""
    tb = _user_frames(error.__traceback__, origin)
    sys.excepthook(type(error), error.with_traceback(tb), tb)
    return INTERRUPTED_STATUS if isinstance(error, KeyboardInterrupt) else 1


def _origin_of_module(name: str) -> Optional[str]:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(name + ".__main__")
    return spec.origin if spec is not None else None


class _InterpreterState:
    """The process-wide state a run changes: argv, the import path and finders, PYTHONPATH."""

    def __init__(self) -> None:
        self.argv, self.path, self.meta_path = sys.argv, sys.path, sys.meta_path
        self.argv_items, self.path_items, self.finders_before = list(sys.argv), list(sys.path), list(sys.meta_path)
        self.pythonpath = os.environ.get("PYTHONPATH")

    def restore(self) -> None:
        """Put back the same list objects with the same items (the script may have rebound or edited them).

        `sys.meta_path` loses only the apexlite finders the run added: a finder a library imported
        during the run added (six's, a lazy loader's) still serves modules that stay loaded, so it stays.
        """
        sys.argv, sys.path = self.argv, self.path
        self.argv[:], self.path[:] = self.argv_items, self.path_items
        current = sys.meta_path
        sys.meta_path = self.meta_path
        self.meta_path[:] = [finder for finder in current
                             if finder in self.finders_before or not hook.is_apexlite_finder(finder)]
        if self.pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = self.pythonpath


@contextlib.contextmanager
def _legacy_environment(argv: List[str], path0: str) -> Iterator[None]:
    """`sys.argv`/`sys.path[0]` as `python SCRIPT` sets them, the hook installed; all undone on exit.

    The hook serves this process. Processes it starts get `child_path` first on `PYTHONPATH` (new
    interpreters, spawn/forkserver children): its `sitecustomize` installs the hook there at start-up,
    ahead of everything on their `sys.path`. `sys.path` gets the folder too, for children started with
    `-S` (no sitecustomize), which still find the `apex`/`amp_C` stand-ins in it.
    """
    saved = _InterpreterState()
    layer_precision.install_from_environment()  # migrate --verify's count of layer dtypes, when it asks
    finder = hook.install()
    try:
        sys.argv = argv
        sys.path[0:1] = [path0, CHILD_PATH]
        os.environ["PYTHONPATH"] = CHILD_PATH + (os.pathsep + saved.pythonpath if saved.pythonpath else "")
        yield
    finally:
        hook.uninstall(finder)
        saved.restore()


def run_script(path: str, args: List[str]) -> int:
    """Run the file, folder or zip archive at `path` as __main__ with the hook installed, as `python PATH`
    runs it (apexlite.script_main); returns the exit status."""
    if not os.path.exists(path):
        sys.stderr.write(f"apexlite run: can't open file {os.path.abspath(path)!r}: [Errno 2] No such file or "
                         "directory\n")
        return 2
    if _is_notebook(path):  # its JSON parses as a Python expression: running it would do nothing, silently
        sys.stderr.write(f"apexlite run: {path} is a Jupyter notebook, which Python does not run; run it in "
                         "Jupyter with `import apexlite; apexlite.install()` in its first cell, or export it "
                         "(`jupyter nbconvert --to script`) and run the .py\n")
        return 2
    with _legacy_environment([path, *args], search_path_entry(path)):
        try:
            namespace, code = load_main(path)
        except SyntaxError as error:  # Python shows where, without a traceback
            sys.excepthook(type(error), error.with_traceback(None), None)
            return 1
        except MainNotFound as error:
            sys.stderr.write(f"apexlite run: {error}\n")
            return 1
        except OSError as error:
            sys.stderr.write(f"apexlite run: can't open file {os.path.abspath(path)!r}: [Errno {error.errno}] "
                             f"{error.strerror}\n")
            return 2
        try:
            with GlooRelease.around_script():
                execute_main(namespace, code)
        except SystemExit:
            raise
        except BaseException as error:  # noqa: B902 -- every other error ends the run as in `python SCRIPT`
            return _report_exception(error, namespace["__file__"])
    return 0


def run_source(source: str, filename: str, argv0: str, args: List[str]) -> int:
    """Run `source` as __main__ as `python -c CODE` (argv0 "-c") or `python -` (argv0 "-") runs it: sys.argv[0]
    is argv0, sys.path[0] the working folder (''), tracebacks name `filename`."""
    with _legacy_environment([argv0, *args], ""):
        try:
            namespace, code = load_source_main(source, filename)
        except SyntaxError as error:
            sys.excepthook(type(error), error.with_traceback(None), None)
            return 1
        try:
            with GlooRelease.around_script():
                execute_main(namespace, code)
        except SystemExit:
            raise
        except BaseException as error:  # noqa: B902 -- as run_script
            return _report_exception(error, filename)
    return 0


def _is_notebook(path: str) -> bool:
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as handle:
            return looks_like_notebook(path, handle.read())
    except OSError:
        return False


def run_module(name: str, args: List[str]) -> int:
    """Run module `name` as __main__ (like `python -m name`) with the hook installed."""
    # runpy replaces argv[0] with the module's path, as `python -m` does
    with _legacy_environment([name, *args], os.getcwd()):
        origin = _origin_of_module(name)
        try:
            with GlooRelease.around_script():
                runpy.run_module(name, run_name="__main__", alter_sys=True)
        except SystemExit:
            raise
        except ImportError as error:
            if origin is None:
                sys.stderr.write(f"apexlite run: No module named {name!r} ({error})\n")
                return 1
            return _report_exception(error, origin)
        except BaseException as error:  # noqa: B902
            return _report_exception(error, origin)
    return 0


def usage() -> str:
    """run's help: USAGE and the environment switches it reads, wrapped to the terminal."""
    return wrap(USAGE + "\n\n" + help_section("run"))


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite run`."""
    if argv[:1] == ["--"]:  # `run -- SCRIPT ARGS`, as `python -- SCRIPT ARGS`
        argv = argv[1:]
        if not argv:
            sys.stderr.write("apexlite run: `--` needs a script after it\n" + usage() + "\n")
            return 2
        return run_script(argv[0], argv[1:])
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(usage() + "\n")
        return 0 if argv else 2
    if argv[0] in ("-m", "-c"):
        if len(argv) < 2:
            what = "a module name" if argv[0] == "-m" else "the code to run"
            sys.stderr.write(f"apexlite run: {argv[0]} needs {what}\n" + usage() + "\n")
            return 2
        if argv[0] == "-c":
            return run_source(argv[1], "<string>", "-c", argv[2:])
        return run_module(argv[1], argv[2:])
    if argv[0] == "-":
        return run_source(sys.stdin.read(), "<stdin>", "-", argv[1:])
    return run_script(argv[0], argv[1:])
