"""Help texts wrapped to the terminal: prose paragraphs refilled, indented items (options, exit statuses,
switches) wrapped under their own text, so no --help line runs past the window.

The width is argparse's: the terminal's columns (COLUMNS when set) less 2. Words are never broken, so a
path or command longer than the window keeps its line.
"""
from __future__ import annotations

import argparse
import re
import shutil
import textwrap
from typing import List, Optional

MIN_WIDTH = 40
_LABEL_GAP = re.compile(r"^(\S+(?: \S+)*?)( {2,})\S")  # `install    write ...`: text aligns after the gap


def width() -> int:
    """The width help text is wrapped to."""
    return max(shutil.get_terminal_size().columns - 2, MIN_WIDTH)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _items(block: List[str]) -> List[List[str]]:
    """Lines grouped into prose paragraphs (unindented lines together) and indented items (a line and the
    lines indented deeper under it)."""
    items: List[List[str]] = []
    for line in block:
        if items:
            first = items[-1][0]
            prose = not _indent(first) and not first.startswith("usage: ")
            if (prose and not _indent(line)) or (_indent(first) and _indent(line) > _indent(first)):
                items[-1].append(line)
                continue
        items.append([line])
    return items


def _fill(item: List[str], columns: int) -> str:
    first = item[0]
    lead = " " * _indent(first)
    text = " ".join(line.strip() for line in item)
    if first.startswith("usage: "):
        hang = " " * len("usage: ")
    elif not lead:
        hang = ""
    else:
        label = _LABEL_GAP.match(text)
        hang = lead + " " * (len(label.group(1)) + len(label.group(2)) if label else 2)
        if len(hang) > columns // 2:
            hang = lead + "    "
    return textwrap.fill(text, columns, initial_indent=lead, subsequent_indent=hang, break_long_words=False,
                         break_on_hyphens=False)


def wrap(text: str, columns: Optional[int] = None) -> str:
    """`text` wrapped to `columns` (default: the terminal's), blank lines and indentation kept."""
    columns = columns or width()
    out: List[str] = []
    block: List[str] = []
    for line in text.splitlines() + [""]:
        if line.strip():
            block.append(line.rstrip())
            continue
        out += [_fill(item, columns) for item in _items(block)]
        block = []
        out.append("")
    return "\n".join(out[:-1])


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter with the description, epilog and a hand-written usage wrapped too."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.indent(wrap(text, max(width, MIN_WIDTH)), indent)

    def _format_usage(self, usage, actions, groups, prefix) -> str:  # type: ignore[no-untyped-def]
        text = super()._format_usage(usage, actions, groups, prefix)
        if usage is None:
            return text
        return wrap(text.strip("\n"), self._width) + "\n\n"
