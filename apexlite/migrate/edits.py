"""The plan of a migration as edits keyed by the original tree's nodes (applied in one pass by
apexlite.migrate.applier), and the small helpers that build the new code and comments.

Planners (one module per concern) only record edits; nothing is rewritten until every planner has
looked at the untouched tree, so no planner sees another's half-done work and each edit still finds its
node. Edits: replace an expression node; replace a small statement by several (split into lines when it
was alone on its line); replace a whole statement; wrap a run of statements of one block in a `with`;
put a comment line above a statement (TODOs and notes). Comments above a removed statement move to the
next one; a block left empty gets `pass`.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence, Tuple, Union

import libcst as cst

from apexlite.migrate.analysis import Analysis

TODO_PREFIX = "# TODO(apexlite migrate): "
COMMENT_WIDTH = 100
NOTE_PREFIX = "# apexlite migrate: "

ExprEdit = Callable[[cst.CSTNode], cst.CSTNode]
SmallEdit = Callable[[cst.BaseSmallStatement], Sequence[cst.BaseSmallStatement]]
StatementEdit = Callable[[cst.BaseStatement], Sequence[cst.BaseStatement]]
WithHeader = Callable[[], cst.With]


@dataclass
class Todo:
    """A place migrate could not rewrite with certainty: original line and what to do."""

    line: int
    message: str


@dataclass
class Plan:
    """Edits for one script, keyed by nodes of the original tree."""

    analysis: Analysis
    expressions: Dict[cst.CSTNode, ExprEdit] = field(default_factory=dict)
    small: Dict[cst.BaseSmallStatement, SmallEdit] = field(default_factory=dict)
    statements: Dict[cst.BaseStatement, StatementEdit] = field(default_factory=dict)
    wraps: List[Tuple[cst.BaseStatement, cst.BaseStatement, WithHeader]] = field(default_factory=list)
    before: Dict[cst.BaseStatement, List[str]] = field(default_factory=dict)  # code of statements put above one
    comments: Dict[cst.BaseStatement, List[str]] = field(default_factory=dict)
    todos: List[Todo] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    names: set = field(default_factory=set)  # fresh names handed out
    handled: set = field(default_factory=set)  # ids of apex-use nodes some planner took care of
    needs_torch: bool = False
    flags: Dict[str, str] = field(default_factory=dict)  # migrate options a rerun needs: "--opt-level" -> "O1"
    merged_edits: bool = False  # a child plan's edits were kept (the amp part changed this file)
    keeps_apex_ddp: bool = False  # O2's amp may stay (kept, or not migrated): apex's DDP -> ddp_from_apex_args

    # --- recording -----------------------------------------------------------------------------------
    def todo(self, node: cst.CSTNode, message: str) -> None:
        """Leave the code at `node` as it is, with a TODO comment above its statement saying what to do."""
        statement = self.analysis.statement_of(node)
        text = TODO_PREFIX + message
        if text not in self.comments.setdefault(statement, []):
            self.comments[statement].append(text)
            self.todos.append(Todo(self.analysis.line(node), message))

    def comment(self, node: cst.CSTNode, message: str) -> None:
        statement = self.analysis.statement_of(node)
        text = NOTE_PREFIX + message
        if text not in self.comments.setdefault(statement, []):
            self.comments[statement].append(text)

    def replace_expression(self, node: cst.CSTNode, edit: ExprEdit) -> None:
        if node in self.expressions:
            raise ValueError(f"two edits of one expression: {self.analysis.code(node)!r}")
        self.expressions[node] = edit

    def replace_small(self, node: cst.BaseSmallStatement, edit: SmallEdit) -> None:
        if node in self.small:
            raise ValueError(f"two edits of one statement at line {self.analysis.line(node)}")
        self.small[node] = edit

    def replace_statement(self, node: cst.BaseStatement, edit: StatementEdit) -> None:
        if node in self.statements:
            raise ValueError(f"two edits of one statement at line {self.analysis.line(node)}")
        self.statements[node] = edit

    def insert_before(self, node: cst.BaseStatement, codes: Sequence[str]) -> None:
        """Put new statements (code, one each) right above `node`, a statement directly in a block."""
        self.before.setdefault(node, []).extend(codes)

    def wrap(self, first: cst.BaseStatement, last: cst.BaseStatement, header: WithHeader) -> None:
        self.wraps.append((first, last, header))

    @property
    def has_edits(self) -> bool:
        """Whether applying the plan changes anything."""
        return bool(self.expressions or self.small or self.statements or self.wraps or self.before or self.comments)

    def is_handled(self, node: cst.CSTNode) -> bool:
        return id(node) in self.handled

    def handle(self, node: cst.CSTNode) -> None:
        self.handled.add(id(node))

    def fresh_name(self, wanted: str) -> str:
        return self.analysis.fresh_name(wanted, self.names)

    def child(self) -> "Plan":
        """A plan for one all-or-nothing part of the migration (merged back with `merge`)."""
        return Plan(self.analysis, names=self.names)

    def merge(self, child: "Plan", keep_edits: bool) -> None:
        """Take `child`'s TODOs (always) and its edits and notes (only with `keep_edits`)."""
        self.todos.extend(child.todos)
        self.flags.update(child.flags)
        self.handled |= child.handled
        for statement, texts in child.comments.items():
            kept = [text for text in texts if keep_edits or text.startswith(TODO_PREFIX)]
            if kept:
                mine = self.comments.setdefault(statement, [])
                mine.extend(text for text in kept if text not in mine)
        if not keep_edits:
            return
        self.merged_edits = self.merged_edits or bool(child.expressions or child.small or child.statements
                                                      or child.wraps or child.before)
        for node, edit in child.expressions.items():
            self.replace_expression(node, edit)
        for node, small_edit in child.small.items():
            self.replace_small(node, small_edit)
        for node, statement_edit in child.statements.items():
            self.replace_statement(node, statement_edit)
        self.wraps.extend(child.wraps)
        for node, codes in child.before.items():
            self.insert_before(node, codes)
        self.notes.extend(child.notes)
        self.needs_torch = self.needs_torch or child.needs_torch


def wrapped_comment(text: str) -> List[str]:
    """A comment as lines of at most COMMENT_WIDTH characters; continuation lines are indented."""
    prefix = TODO_PREFIX if text.startswith(TODO_PREFIX) else NOTE_PREFIX
    body = textwrap.wrap(text[len(prefix):], COMMENT_WIDTH - len(prefix), break_long_words=False,
                         break_on_hyphens=False) or [""]
    return [prefix + body[0]] + ["#     " + line for line in textwrap.wrap(
        " ".join(body[1:]), COMMENT_WIDTH - 6, break_long_words=False, break_on_hyphens=False)]


def comment_line(comment: Union[str, cst.Comment]) -> cst.EmptyLine:
    """A comment line at the block's indentation; a Comment node passed in is kept (the same node), so the
    comment is known to have survived the edit that moved it."""
    node = comment if isinstance(comment, cst.Comment) else cst.Comment(comment)
    return cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(""), comment=node)


def statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def small_statement(code: str) -> cst.BaseSmallStatement:
    line = cst.parse_statement(code)
    assert isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1, code
    return line.body[0].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)


def expression(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)
