"""A file as the Python program `check` and `migrate` read: a script's own source, or the code cells of a
Jupyter notebook (apexlite.notebook), refused with one line unless Python would run it.

"Would run" means it compiles: undecodable bytes, NUL bytes, syntax errors and the errors only the
compiler finds (`return` outside a function, a misplaced `nonlocal`) are all refused. A notebook is
recognised by its .ipynb suffix or by its content (nbformat JSON also parses as a Python expression, so
it is never read as a script that uses nothing).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Optional

from apexlite.notebook import Notebook, is_notebook_path, read_notebook
from apexlite.script_source import MAX_SOURCE_BYTES, NotPythonSource, read_source_bytes

HINT = "check and migrate read Python scripts (.py) and Jupyter notebooks (.ipynb)"


@dataclass
class Program:
    """What was read: the file's bytes, the Python source in it, and the notebook when it is one."""

    path: str
    data: bytes
    source: bytes
    notebook: Optional[Notebook] = None

    def location(self, line: int, source: Optional[bytes] = None) -> str:
        """`line 12` for a script, `cell 3 line 2` for a notebook (`source`: the program the line is in)."""
        if self.notebook is None:
            return f"line {line}"
        cell, cell_line = self.notebook.cell_of_line(line, self.source if source is None else source)
        return f"cell {cell} line {cell_line}"


def looks_like_notebook(path: str, data: bytes) -> bool:
    if is_notebook_path(path):
        return True
    if not data.lstrip()[:1] == b"{":
        return False
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(document, dict) and "cells" in document and "nbformat" in document


def check_runs(source: bytes, path: str, locate: Callable[[int], str] = lambda line: f"line {line}") -> None:
    """NotPythonSource unless Python would compile `source` (`locate` names a line of it for the message)."""
    hint = "" if path.endswith(".py") else f"; {HINT}"
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as error:
        where = f" ({locate(error.lineno)})" if error.lineno else ""
        raise NotPythonSource(f"{path} is not Python source Python would run: {error.msg}{where}{hint}") from None
    except (ValueError, RecursionError, MemoryError) as error:
        raise NotPythonSource(f"{path} is not Python source apexlite can read: {error}{hint}") from None


def load_program(path: str, max_bytes: int = MAX_SOURCE_BYTES) -> Program:
    """The program in the file at `path` (ScriptSourceError and its kinds say why not)."""
    data = read_source_bytes(path, max_bytes)
    if looks_like_notebook(path, data):
        notebook = read_notebook(data, path)
        result = Program(path, data, notebook.program(), notebook)
        check_runs(result.source, path, lambda line: result.location(line))
        return result
    check_runs(data, path)
    return Program(path, data, data)
