"""The comments of code a migration removes or replaces, kept as comment lines with their exact text.

An edit may drop a subtree that holds comments: an `if fp16:` block whose amp.initialize became a
GradScaler above it, a `try:` of apex imports, a replaced call written over several lines. Every comment
line and blank line of such a subtree (the commented-out code inside a block, the lines trailing it
that libcst gives to the block's footer) comes back as it was, byte for byte: a line that was indented
keeps its indentation, written out as whitespace so it renders the same in whatever block it lands in.
A comment that ended a code line that is gone gets a line of its own at that code's indentation.
"""
from __future__ import annotations

from typing import Iterator, List, Sequence, Set

import libcst as cst


def line_key(line: cst.EmptyLine) -> int:
    """What identifies a line across edits: its comment (kept by identity when a line moves), else itself."""
    return id(line.comment) if line.comment is not None else id(line)


def _absolute(line: cst.EmptyLine, indent: str) -> cst.EmptyLine:
    if not line.indent:
        return line
    return line.with_changes(indent=False, whitespace=cst.SimpleWhitespace(indent + line.whitespace.value))


def _own_line(comment: cst.Comment, indent: str) -> cst.EmptyLine:
    return cst.EmptyLine(indent=False, whitespace=cst.SimpleWhitespace(indent), comment=comment)


def _lines(node: cst.CSTNode, indent: str, default_indent: str) -> Iterator[tuple]:
    """(key, line as it would render at indentation `indent`) for every comment and blank line in `node`,
    in source order."""
    if isinstance(node, cst.EmptyLine):
        yield line_key(node), _absolute(node, indent)
        return
    if isinstance(node, cst.TrailingWhitespace):
        if node.comment is not None:
            yield id(node.comment), _own_line(node.comment, indent)
        return
    if isinstance(node, cst.IndentedBlock):
        yield from _lines(node.header, indent, default_indent)
        inner = indent + (default_indent if node.indent is None else node.indent)
        for child in [*node.body, *node.footer]:
            yield from _lines(child, inner, default_indent)
        return
    for child in node.children:
        yield from _lines(child, indent, default_indent)


def kept_keys(nodes: Sequence[cst.CSTNode]) -> Set[int]:
    """The keys of every comment and line that survives in `nodes` (the code an edit produced)."""
    keys: Set[int] = set()
    stack: List[cst.CSTNode] = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, cst.EmptyLine):
            keys.add(line_key(node))
        elif isinstance(node, cst.Comment):
            keys.add(id(node))
        else:
            stack.extend(node.children)
    return keys


def lost_lines(removed: Sequence[cst.CSTNode], produced: Sequence[cst.CSTNode], indent: str,
               default_indent: str) -> List[cst.EmptyLine]:
    """The lines of `removed` (at indentation `indent`) that `produced` does not hold, blank lines at either
    end left out; empty when no comment was lost."""
    kept = kept_keys(produced)
    lines = [line for node in removed for key, line in _lines(node, indent, default_indent) if key not in kept]
    if not any(line.comment is not None for line in lines):
        return []
    while lines and lines[0].comment is None:
        lines.pop(0)
    while lines and lines[-1].comment is None:
        lines.pop()
    return lines
