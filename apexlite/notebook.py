"""Jupyter notebooks as one Python program, and back: what `check` and `migrate` read in an .ipynb file.

A notebook is JSON (nbformat 4: {"cells": [{"cell_type": "code", "source": text or lines}, ...]}); nbformat
itself is not needed. Its code cells run in one kernel and share its state, so they are read as one
program: cell after cell, each after a marker comment naming it. IPython's lines that are not Python
(`%magic`, `!shell`, `obj?`, and the continuation lines of one ending in a backslash) become a `pass`
placeholder of the same indentation, restored on the way back; a cell whose cell magic does not run its body as Python (`%%bash`, `%%writefile`, ...) stays out of
the program and is kept as it is. Writing back changes only code cells' sources: outputs, metadata and
the other cells are kept, and so is the JSON layout when it is one `json.dumps` can reproduce
(nbformat's own, indent 1 and sorted keys, among them); otherwise nbformat's layout is used and said.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from apexlite.script_source import NotPythonSource

NOTEBOOK_SUFFIX = ".ipynb"
CELL_MARKER = "# <apexlite notebook cell {}>"
_CELL_MARKER = re.compile(r"^(\s*)# <apexlite notebook cell (\d+)>$")
_MAGIC_PLACEHOLDER = "pass  # <apexlite notebook magic {}>"
_MAGIC = re.compile(r"^(\s*)pass  # <apexlite notebook magic (\d+)>$")
# cell magics that run their body as Python in the kernel (the rest: shell, other languages, files)
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug"})
_LAYOUTS = [dict(indent=indent, sort_keys=sort_keys, ensure_ascii=ascii_only)
            for indent in (1, 2, 4, None) for sort_keys in (True, False) for ascii_only in (False, True)]
NBFORMAT_LAYOUT = _LAYOUTS[0]


class NotebookError(NotPythonSource):
    """A notebook that cannot be read (not nbformat 4 JSON, not a Python kernel) or rebuilt."""


def is_notebook_path(path: str) -> bool:
    return path.lower().endswith(NOTEBOOK_SUFFIX)


_HELP = re.compile(r"^\s*(\?{1,2}[\w.]+|[\w.]+\?{1,2})\s*$")  # `obj?`, `obj??`, `?obj`


def _is_ipython_line(line: str) -> bool:
    return line.lstrip().startswith(("%", "!")) or _HELP.match(line) is not None


@dataclass
class Notebook:
    """A parsed notebook and the program made of its code cells."""

    path: str
    document: Dict[str, Any]
    layout: Optional[Dict[str, Any]]  # the json.dumps settings that reproduce the file, None if none does
    final_newline: bool
    program_cells: List[int] = field(default_factory=list)  # indices (0-based) of cells in the program
    kept_cells: List[Tuple[int, str]] = field(default_factory=list)  # (index, cell magic) kept out of it
    magics: List[Tuple[str, str]] = field(default_factory=list)  # each placeholder's line and indent

    @property
    def cells(self) -> List[Dict[str, Any]]:
        return self.document["cells"]

    def program(self) -> bytes:
        """The code cells as one UTF-8 Python program (markers and placeholders included)."""
        lines: List[str] = []
        self.program_cells, self.kept_cells, self.magics = [], [], []
        for index, cell in enumerate(self.cells):
            if cell.get("cell_type") != "code":
                continue
            text = _source_text(cell)
            first = text.lstrip().split("\n", 1)[0]
            if first.startswith("%%") and first[2:].split(" ", 1)[0] not in PYTHON_CELL_MAGICS:
                self.kept_cells.append((index, first))
                continue
            self.program_cells.append(index)
            lines.append(CELL_MARKER.format(index))
            continued_indent: Optional[str] = None  # a `!cmd \` line's indent while its continuation lasts
            for line in text.split("\n"):
                if continued_indent is not None or _is_ipython_line(line):
                    indent = continued_indent if continued_indent is not None else line[:len(line) - len(line.lstrip())]
                    lines.append(indent + _MAGIC_PLACEHOLDER.format(len(self.magics)))
                    self.magics.append((line, indent))
                    continued_indent = indent if line.endswith("\\") else None
                else:
                    lines.append(line)
        return ("\n".join(lines) + "\n").encode("utf-8")

    def kept_cells_naming_apex(self) -> List[Tuple[int, str]]:
        """(index, cell magic) of the cells kept out of the program whose text names apex (after program())."""
        return [(index, magic) for index, magic in self.kept_cells
                if any(root in _source_text(self.cells[index]) for root in ("apex", "amp_C"))]

    def cell_of_line(self, program_line: int, program: bytes) -> Tuple[int, int]:
        """(cell number from 1, line in that cell from 1) of a line of `program` (this notebook's program,
        or its migration)."""
        cell, start = 0, 0
        for number, line in enumerate(program.decode("utf-8", "replace").split("\n"), start=1):
            if number > program_line:
                break
            found = _CELL_MARKER.match(line)
            if found:
                cell, start = int(found.group(2)), number
        return cell + 1, program_line - start

    def rebuilt(self, program: bytes) -> bytes:
        """The notebook with each program cell's source taken from `program` (a migration of `program()`)."""
        sources = self._split(program.decode("utf-8"))
        document = json.loads(json.dumps(self.document))
        for index, text in sources.items():
            cell = document["cells"][index]
            if text != _source_text(cell):
                cell["source"] = _source_lines(text) if isinstance(cell.get("source"), list) else text
        return dump(document, self.layout or NBFORMAT_LAYOUT, self.final_newline)

    def cells_text(self, data: bytes) -> str:
        """The code cells of the notebook in `data` (this one or a rebuilt one) as text to read or diff,
        each under a `# In[cell N]` line."""
        document = json.loads(data.decode("utf-8"))
        return "".join(f"# In[cell {index + 1}]\n{_source_text(cell)}\n"
                       for index, cell in enumerate(document["cells"]) if cell.get("cell_type") == "code")

    def _split(self, text: str) -> Dict[int, str]:
        pieces: Dict[int, List[str]] = {}
        current: Optional[List[str]] = None
        opened = self.program_cells[0] if self.program_cells else 0
        for line in (text[:-1] if text.endswith("\n") else text).split("\n"):
            marker = _CELL_MARKER.match(line)
            if marker:
                index = int(marker.group(2))
                if marker.group(1):
                    raise NotebookError(f"the rewrite puts cell {index + 1} inside a block that begins in cell "
                                        f"{opened + 1} (an autocast region spans them); join cells {opened + 1} to "
                                        f"{index + 1} into one and migrate again")
                opened, current = index, pieces.setdefault(index, [])
                continue
            if current is None:  # lines the rewrite put above the first cell go into it
                current = pieces.setdefault(self.program_cells[0], [])
            magic = _MAGIC.match(line)
            if magic:  # the original line, moved by as much as the rewrite moved its placeholder
                original, indent = self.magics[int(magic.group(2))]
                line = magic.group(1) + original[len(indent):]
            current.append(line)
        if sorted(pieces) != sorted(self.program_cells):
            raise NotebookError("the rewrite lost the boundaries between cells; the notebook is kept as it was")
        return {index: "\n".join(lines) for index, lines in pieces.items()}


def _source_text(cell: Dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _source_lines(text: str) -> List[str]:
    """A cell's text as nbformat stores it in a list: every line keeps its newline."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def dump(document: Dict[str, Any], layout: Dict[str, Any], final_newline: bool) -> bytes:
    text = json.dumps(document, **layout)
    return (text + ("\n" if final_newline else "")).encode("utf-8")


def _layout_of(document: Dict[str, Any], text: str) -> Optional[Dict[str, Any]]:
    body = text[:-1] if text.endswith("\n") else text
    return next((layout for layout in _LAYOUTS if json.dumps(document, **layout) == body), None)


def read_notebook(data: bytes, path: str) -> Notebook:
    """The notebook in `data`, or NotebookError saying why it is not one migrate and check can read."""
    try:
        text = data.decode("utf-8")
        document = json.loads(text)
    except (UnicodeDecodeError, ValueError) as error:
        raise NotebookError(f"{path} is not a Jupyter notebook (not JSON: {error}); rename it if it is Python "
                            "source") from None
    if not isinstance(document, dict) or not isinstance(document.get("cells"), list):
        hint = " (nbformat 3: convert it with `jupyter nbconvert --to notebook --nbformat 4`)" \
            if isinstance(document, dict) and "worksheets" in document else ""
        raise NotebookError(f"{path} is not an nbformat 4 Jupyter notebook: no list of cells{hint}")
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    language = ((metadata.get("kernelspec") or {}).get("language") or (metadata.get("language_info") or {}).get("name")
                or "python")
    if str(language).lower() != "python":
        raise NotebookError(f"{path} is a {language} notebook, not a Python one; nothing to read")
    if any(not isinstance(cell, dict) for cell in document["cells"]):
        raise NotebookError(f"{path} is not an nbformat 4 Jupyter notebook: a cell is not a JSON object")
    return Notebook(path, document, _layout_of(document, text), text.endswith("\n"))
