"""The plan of a migration as edits keyed by the original tree's nodes, and the transformer that applies
them in one pass.

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
from typing import Callable, Dict, List, Optional, Sequence, Tuple

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
    comments: Dict[cst.BaseStatement, List[str]] = field(default_factory=dict)
    todos: List[Todo] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    names: set = field(default_factory=set)  # fresh names handed out
    handled: set = field(default_factory=set)  # ids of apex-use nodes some planner took care of
    needs_torch: bool = False

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

    def wrap(self, first: cst.BaseStatement, last: cst.BaseStatement, header: WithHeader) -> None:
        self.wraps.append((first, last, header))

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
        self.handled |= child.handled
        for statement, texts in child.comments.items():
            kept = [text for text in texts if keep_edits or text.startswith(TODO_PREFIX)]
            if kept:
                mine = self.comments.setdefault(statement, [])
                mine.extend(text for text in kept if text not in mine)
        if not keep_edits:
            return
        for node, edit in child.expressions.items():
            self.replace_expression(node, edit)
        for node, small_edit in child.small.items():
            self.replace_small(node, small_edit)
        for node, statement_edit in child.statements.items():
            self.replace_statement(node, statement_edit)
        self.wraps.extend(child.wraps)
        self.notes.extend(child.notes)
        self.needs_torch = self.needs_torch or child.needs_torch


def wrapped_comment(text: str) -> List[str]:
    """A comment as lines of at most COMMENT_WIDTH characters; continuation lines are indented."""
    prefix = TODO_PREFIX if text.startswith(TODO_PREFIX) else NOTE_PREFIX
    body = textwrap.wrap(text[len(prefix):], COMMENT_WIDTH - len(prefix), break_long_words=False,
                         break_on_hyphens=False) or [""]
    return [prefix + body[0]] + ["#     " + line for line in textwrap.wrap(
        " ".join(body[1:]), COMMENT_WIDTH - 6, break_long_words=False, break_on_hyphens=False)]


def comment_line(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(""), comment=cst.Comment(text))


def statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def small_statement(code: str) -> cst.BaseSmallStatement:
    line = cst.parse_statement(code)
    assert isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1, code
    return line.body[0].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)


def expression(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


class Applier(cst.CSTTransformer):
    """Applies a Plan to the tree it was made from (run through the same MetadataWrapper). Only the paths
    from the module to the edited nodes are entered: every other subtree comes out as it went in, uncopied."""

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan
        self.wrap_starts = {first: (last, header) for first, last, header in plan.wraps}
        self.on_paths = self._paths_to_edits()

    def _paths_to_edits(self) -> set:
        edited = [*self.plan.expressions, *self.plan.small, *self.plan.statements, *self.plan.comments,
                  *(node for wrap in self.plan.wraps for node in wrap[:2])]
        on_paths: set = set()
        for node in edited:
            while node is not None and node not in on_paths:
                on_paths.add(node)
                node = self.plan.analysis.parent(node)
        return on_paths

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.on_paths or isinstance(node, cst.Module)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        edit = self.plan.expressions.get(original_node)
        if edit is not None:
            return edit(updated_node)
        if isinstance(original_node, (cst.Module, cst.IndentedBlock)):
            body, left = self._block(original_node.body, updated_node.body)
            if not body and isinstance(original_node, cst.IndentedBlock):
                body, left = [cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=left)], []
            footer = [*left, *updated_node.footer] if any(line.comment for line in left) else updated_node.footer
            return updated_node.with_changes(body=body, footer=footer)
        if isinstance(original_node, cst.SimpleStatementSuite):
            return updated_node.with_changes(body=self._smalls(original_node.body, updated_node.body))
        return updated_node

    def _smalls(self, originals: Sequence[cst.BaseSmallStatement], updated: Sequence[cst.BaseSmallStatement],
                allow_empty: bool = False) -> List[cst.BaseSmallStatement]:
        out: List[cst.BaseSmallStatement] = []
        for original, new in zip(originals, updated):
            edit = self.plan.small.get(original)
            out.extend(edit(new) if edit is not None else [new])
        if not out:
            if allow_empty:
                return []
            out = [cst.Pass()]
        last = len(out) - 1
        return [stmt.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) if i == last else
                stmt.with_changes(semicolon=cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" ")))
                for i, stmt in enumerate(out)]

    def _line(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine) -> List[cst.BaseStatement]:
        if not any(stmt in self.plan.small for stmt in original.body):
            return [updated]
        smalls = self._smalls(original.body, updated.body, allow_empty=True)
        if not smalls:
            return []
        if len(original.body) != 1:
            return [updated.with_changes(body=smalls)]
        lines: List[cst.BaseStatement] = [cst.SimpleStatementLine(body=[stmt.with_changes(
            semicolon=cst.MaybeSentinel.DEFAULT)]) for stmt in smalls]
        kept = next((index for index, stmt in enumerate(smalls) if stmt is updated.body[0]), None)
        leading = list(updated.leading_lines)
        trailing = updated.trailing_whitespace
        if kept is None and trailing.comment is not None:  # the statement is gone: its comment goes above
            leading.append(comment_line(trailing.comment.value))
            trailing = cst.TrailingWhitespace()
        index = len(lines) - 1 if kept is None else kept
        lines[index] = lines[index].with_changes(trailing_whitespace=trailing)
        lines[0] = lines[0].with_changes(leading_lines=leading)
        return lines

    def _block(self, originals: Sequence[cst.BaseStatement],
               updated: Sequence[cst.BaseStatement]) -> Tuple[List[cst.BaseStatement], List[cst.EmptyLine]]:
        """The block's new statements, and the comment lines of removed statements left at its end."""
        out: List[cst.BaseStatement] = []
        carried: List[cst.EmptyLine] = []  # lines above statements that were removed
        wrapping: Optional[Tuple[cst.BaseStatement, WithHeader, List[cst.BaseStatement]]] = None
        for original, new in zip(originals, updated):
            produced = self._statement(original, new)
            if not produced:
                carried.extend([*new.leading_lines, *self._comment_lines(original, ())])
            elif carried:
                produced[0] = produced[0].with_changes(leading_lines=_merge_leading(carried, produced[0].leading_lines))
                carried = []
            if original in self.wrap_starts and wrapping is None:
                last, header = self.wrap_starts[original]
                wrapping = (last, header, [])
            if wrapping is not None:
                wrapping[2].extend(produced)
                if original is wrapping[0]:
                    out.append(_wrapped(wrapping[1](), wrapping[2]))
                    wrapping = None
                continue
            out.extend(produced)
        return out, carried

    def _comment_lines(self, original: cst.BaseStatement, existing_lines: Sequence[cst.EmptyLine]) -> List[cst.EmptyLine]:
        existing = {line.comment.value for line in existing_lines if line.comment is not None}
        out = []
        for text in self.plan.comments.get(original, ()):
            lines = wrapped_comment(text)
            if lines[0] not in existing:
                out.extend(comment_line(line) for line in lines)
        return out

    def _statement(self, original: cst.BaseStatement, new: cst.BaseStatement) -> List[cst.BaseStatement]:
        edit = self.plan.statements.get(original)
        if edit is not None:
            produced = list(edit(new))
            if produced:
                produced[0] = produced[0].with_changes(
                    leading_lines=[*new.leading_lines, *produced[0].leading_lines])
        elif isinstance(original, cst.SimpleStatementLine):
            produced = self._line(original, new)
        else:
            produced = [new]
        if produced:
            lines = produced[0].leading_lines
            produced[0] = produced[0].with_changes(leading_lines=[*lines, *self._comment_lines(original, lines)])
        return produced


def _merge_leading(carried: Sequence[cst.EmptyLine], existing: Sequence[cst.EmptyLine]) -> List[cst.EmptyLine]:
    """Lines of removed statements above the next one, without doubling the blank lines between them."""
    existing_blank = bool(existing) and existing[0].comment is None
    if not any(line.comment for line in carried):
        return list(existing) if existing_blank else [*carried, *existing]
    carried = list(carried)
    while existing_blank and carried and carried[-1].comment is None:
        carried.pop()
    return [*carried, *existing]


def _wrapped(header: cst.With, body: List[cst.BaseStatement]) -> cst.With:
    """`header` around `body`; the comments above the first statement move above the `with`."""
    first = body[0]
    leading = first.leading_lines
    body = [first.with_changes(leading_lines=[]), *body[1:]]
    return header.with_changes(leading_lines=leading, body=cst.IndentedBlock(body=body))
