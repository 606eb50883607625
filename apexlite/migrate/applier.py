"""Applying a migration's Plan to the tree it was made from, in one libcst pass.

Only the paths from the module to the edited nodes are entered; every other subtree comes out as it
went in. Comments above a removed statement move to the next one, and every comment inside code an edit
removed or replaced comes back after what replaced it, with its exact text (apexlite.migrate.kept_comments);
a block left empty gets `pass`, a `try:` whose body the migration emptied (apex's import guard) goes with
its ImportError handlers, and a run of statements is wrapped in a `with` header where the plan asks.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import libcst as cst

from apexlite.migrate.edits import Plan, WithHeader, comment_line, statement, wrapped_comment
from apexlite.migrate.kept_comments import lost_lines


class Applier(cst.CSTTransformer):
    """Applies a Plan to the tree it was made from (run through the same MetadataWrapper). Only the paths
    from the module to the edited nodes are entered: every other subtree comes out as it went in, uncopied."""

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan
        self.wrap_starts = {first: (last, header) for first, last, header in plan.wraps}
        self.emptied: set = set()  # ids of the `pass` statements put in blocks this pass emptied
        self.on_paths = self._paths_to_edits()
        self.default_indent = plan.analysis.module.default_indent
        self.lost: dict = {}  # original statement -> comment lines of expressions replaced inside it

    def _paths_to_edits(self) -> set:
        edited = [*self.plan.expressions, *self.plan.small, *self.plan.statements, *self.plan.comments,
                  *self.plan.before,
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
            replacement = edit(updated_node)
            self._keep_lost(original_node, [updated_node], [replacement])
            return replacement
        if isinstance(original_node, (cst.Module, cst.IndentedBlock)):
            body, left = self._block(original_node, updated_node.body)
            if not body and isinstance(original_node, cst.IndentedBlock):
                filler = cst.Pass()
                self.emptied.add(id(filler))
                body, left = [cst.SimpleStatementLine(body=[filler], leading_lines=left)], []
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
            self.emptied.add(id(out[0]))
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
            leading.append(comment_line(trailing.comment))
            trailing = cst.TrailingWhitespace()
        index = len(lines) - 1 if kept is None else kept
        lines[index] = lines[index].with_changes(trailing_whitespace=trailing)
        lines[0] = lines[0].with_changes(leading_lines=leading)
        return lines

    def _indent(self, block: cst.CSTNode) -> str:
        """The indentation a block's statements render at (the module's: none)."""
        blocks = [block, *self.plan.analysis.ancestors(block)]
        return "".join(self.default_indent if node.indent is None else node.indent
                       for node in reversed(blocks) if isinstance(node, cst.IndentedBlock))

    def _keep_lost(self, original: cst.CSTNode, removed: Sequence[cst.CSTNode],
                   produced: Sequence[cst.CSTNode]) -> None:
        """Note the comment lines an expression edit inside `original`'s statement dropped."""
        holder = self.plan.analysis.statement_of(original)
        lines = lost_lines(removed, produced, self._indent(self.plan.analysis.block_of(holder)), self.default_indent)
        if lines:
            self.lost.setdefault(holder, []).extend(lines)

    def _block(self, block: cst.CSTNode,
               updated: Sequence[cst.BaseStatement]) -> Tuple[List[cst.BaseStatement], List[cst.EmptyLine]]:
        """The block's new statements, and the comment lines of removed statements left at its end."""
        out: List[cst.BaseStatement] = []
        carried: List[cst.EmptyLine] = []  # lines above statements that were removed, and lines they held
        wrapping: Optional[Tuple[cst.BaseStatement, WithHeader, List[cst.BaseStatement]]] = None
        indent = None
        for original, new in zip(block.body, updated):
            produced, replaced = self._statement(original, new)
            lost: List[cst.EmptyLine] = list(self.lost.pop(original, ()))
            if replaced:
                indent = self._indent(block) if indent is None else indent
                lost += lost_lines([new.with_changes(leading_lines=())], produced, indent, self.default_indent)
            if not produced:
                carried.extend([*new.leading_lines, *self._comment_lines(original, ()), *lost])
                continue
            if carried:
                produced[0] = produced[0].with_changes(leading_lines=_merge_leading(carried, produced[0].leading_lines))
            carried = lost
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

    def _statement(self, original: cst.BaseStatement,
                   new: cst.BaseStatement) -> Tuple[List[cst.BaseStatement], bool]:
        """The statements `new` becomes, and whether any of its own code was replaced or removed (so comments
        it held may need keeping)."""
        edit = self.plan.statements.get(original)
        replaced = True
        if edit is not None:
            produced = list(edit(new))
            if produced:
                produced[0] = produced[0].with_changes(
                    leading_lines=[*new.leading_lines, *produced[0].leading_lines])
        elif isinstance(original, cst.SimpleStatementLine):
            produced = self._line(original, new)
            replaced = not (len(produced) == 1 and produced[0] is new)
        elif self._emptied_if(new):
            produced = []
        else:
            dead = self._dead_try(original, new) if isinstance(new, cst.Try) else None
            produced, replaced = ([new], False) if dead is None else (dead, True)
        inserted = [statement(code + "\n") for code in self.plan.before.get(original, ())]
        if inserted:
            if produced:
                inserted[0] = inserted[0].with_changes(leading_lines=produced[0].leading_lines)
                produced[0] = produced[0].with_changes(leading_lines=[])
            else:
                inserted[0] = inserted[0].with_changes(leading_lines=new.leading_lines)
            produced = [*inserted, *produced]
        if produced:
            lines = produced[0].leading_lines
            produced[0] = produced[0].with_changes(leading_lines=[*lines, *self._comment_lines(original, lines)])
        return produced, replaced

    def _is_filler(self, body: cst.BaseSuite) -> bool:
        """Whether `body` is only the `pass` this pass put in a block it emptied."""
        smalls = body.body if isinstance(body, cst.SimpleStatementSuite) else (
            body.body[0].body if len(body.body) == 1 and isinstance(body.body[0], cst.SimpleStatementLine) else ())
        return len(smalls) == 1 and id(smalls[0]) in self.emptied

    def _emptied_if(self, new: cst.BaseStatement) -> bool:
        """An `if` with no `else` whose body migrate emptied and whose test has no side effect: it goes."""
        from apexlite.migrate.guards import is_pure

        return isinstance(new, cst.If) and new.orelse is None and self._is_filler(new.body) and is_pure(new.test)

    def _dead_try(self, original: cst.Try, new: cst.Try) -> Optional[List[cst.BaseStatement]]:
        """`try: <apex imports> [FLAG = True] except ImportError: ...` once migrate removed every import it
        tried: nothing in it can raise ImportError any more, so it becomes its remaining assignments."""
        if new.finalbody is not None or new.orelse is not None or not new.handlers \
                or not all(_catches_import_error(handler) for handler in new.handlers):
            return None
        if self._is_filler(new.body):
            return []
        kept = list(new.body.body) if isinstance(new.body, cst.IndentedBlock) else None
        if kept is None or len(kept) >= len(original.body.body) or not all(_constant_assignment(line) for line in kept):
            return None
        return [line.with_changes(leading_lines=new.leading_lines) if index == 0 else line
                for index, line in enumerate(kept)]


def _catches_import_error(handler: cst.ExceptHandler) -> bool:
    names = [handler.type] if not isinstance(handler.type, cst.Tuple) else [e.value for e in handler.type.elements]
    return handler.type is not None and all(isinstance(name, cst.Name) and name.value in (
        "ImportError", "ModuleNotFoundError") for name in names)


def _constant_assignment(line: cst.BaseStatement) -> bool:
    """`NAME = True` (or another literal constant): nothing that could raise."""
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Assign)):
        return False
    assign = line.body[0]
    value = assign.value
    return all(isinstance(target.target, cst.Name) for target in assign.targets) and (
        isinstance(value, (cst.SimpleString, cst.Integer, cst.Float)) or
        isinstance(value, cst.Name) and value.value in ("True", "False", "None"))


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
