"""Line numbers of a libcst tree's nodes, for the TODOs and messages that name them.

libcst's PositionProvider tracks line and column through every token and allocates two positions per
node; migrate only ever needs a node's first line. One plain code generation records, for each node, how
many tokens came before its syntactic start (the same start PositionProvider reports: after its leading
blank and comment lines); the newlines in those tokens, counted once, give the line.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional

import libcst as cst
from libcst._nodes.internal import CodegenState

_NEWLINE = re.compile(r"\r\n?|\n")


class _StartRecorder(CodegenState):
    """Code generation that notes the token index each node's syntactic position starts at."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.starts: Dict[cst.CSTNode, int] = {}
        self._open: List[int] = []

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._open.append(len(self.tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:  # nodes without a syntactic position: where they begin
        start = self._open.pop()
        if node not in self.starts:
            self.starts[node] = start

    @contextmanager
    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None,
                                  end_node: Optional[cst.CSTNode] = None) -> Iterator[None]:
        start = len(self.tokens)
        yield
        self.starts[node] = self.starts[start_node] if start_node is not None else start


class LineIndex:
    """The first line of every node of one module, computed in one code generation."""

    def __init__(self, module: cst.Module) -> None:
        recorder = _StartRecorder(module)
        module._codegen(recorder)
        self._starts = recorder.starts
        self._line_before: List[int] = [1]  # line at token index i
        line = 1
        for token in recorder.tokens:
            if "\n" in token or "\r" in token:
                line += len(_NEWLINE.findall(token))
            self._line_before.append(line)

    def line(self, node: cst.CSTNode) -> int:
        return self._line_before[self._starts[node]]
