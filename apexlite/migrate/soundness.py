"""Which names a script reads where some path leaves them undefined: a definite-assignment analysis.

migrate refuses a rewrite that reads a name on a path where the original defined it and the rewrite does
not (a GradScaler created inside `if fp16:` and stepped unconditionally): `undefined_reads(new) -
undefined_reads(old)` must be empty. The analysis follows Python's flow within each scope (branches,
loops, break/continue/return, try/except/finally, with, match) on the standard `ast`. A name local to
a function is checked at each read; a function's free names against the state of the scope that
defines them (a module's at its end, taking `if __name__ == "__main__":`; an enclosing function's at
the nested `def`). It over-approximates (any path, not only feasible ones), which is why migrate
compares the rewrite with the original instead of refusing every flagged read.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from apexlite.migrate.local_names import LocalNames, scope_body, target_names

State = Optional[FrozenSet[str]]  # names definitely bound; None: no path gets here
Read = Tuple[str, str]  # (scope's qualified name, name)

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_SCOPES = _FUNCTIONS + (ast.ClassDef,)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _meet(*states: State) -> State:
    """The names bound on every path of `states` (None paths do not count)."""
    live = [state for state in states if state is not None]
    if not live:
        return None
    result = live[0]
    for state in live[1:]:
        result = result & state
    return result


def _add(state: State, names) -> State:
    return None if state is None else state | frozenset(names)


def _is_main_guard(test: ast.AST) -> bool:
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__" \
        and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq) and isinstance(test.comparators[0], ast.Constant) \
        and test.comparators[0].value == "__main__"


def _always_true(test: ast.AST) -> bool:
    return isinstance(test, ast.Constant) and bool(test.value)


@dataclass
class _Scope:
    name: str
    node: ast.AST
    parent: Optional["_Scope"]
    locals: Set[str] = field(default_factory=set)
    declared_outside: Set[str] = field(default_factory=set)  # global / nonlocal names
    is_function: bool = False
    is_module: bool = False
    state_at_child: Dict[int, State] = field(default_factory=dict)  # id(nested def/class) -> state there
    exit_state: State = None
    returns: List[State] = field(default_factory=list)  # the state at each `return`


class _Analyser:
    def __init__(self) -> None:
        self.undefined: Dict[Read, int] = {}
        self.deferred: List[Tuple[_Scope, ast.AST]] = []  # nested functions, analysed after their parent
        self.global_declared: Set[str] = set()  # names some function declares `global`

    # --- scopes ----------------------------------------------------------------------------------------
    def new_scope(self, node: ast.AST, parent: Optional[_Scope]) -> _Scope:
        if parent is None:
            name = "<module>"
        else:
            own = getattr(node, "name", "<lambda>")
            name = own if parent.is_module else f"{parent.name}.{own}"
        scope = _Scope(name, node, parent, is_function=isinstance(node, _FUNCTIONS), is_module=parent is None)
        finder = LocalNames()
        for statement in scope_body(node):
            finder.visit(statement)
        if isinstance(node, _FUNCTIONS):
            arguments = node.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                        *filter(None, [arguments.vararg, arguments.kwarg])]:
                finder.bound.add(arg.arg)
        scope.declared_outside = finder.declared
        scope.locals = finder.bound - finder.declared
        return scope

    def run(self, tree: ast.Module) -> Dict[Read, int]:
        module = self.new_scope(tree, None)
        module.exit_state = self.block(module, tree.body, frozenset(), loop=None)
        while self.deferred:
            scope, node = self.deferred.pop(0)
            state = frozenset(scope.locals & self._parameters(node))
            if isinstance(node, ast.Lambda):
                self.expression(scope, node.body, state)
            else:
                end = self.block(scope, node.body, state, loop=None)
                scope.exit_state = _meet(end, *scope.returns)
        return self.undefined

    @staticmethod
    def _parameters(node) -> Set[str]:
        arguments = node.args
        return {arg.arg for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                                    *filter(None, [arguments.vararg, arguments.kwarg])]}

    # --- reads ---------------------------------------------------------------------------------------
    def read(self, scope: _Scope, name: str, line: int, state: State, shadowed: FrozenSet[str]) -> None:
        if state is None or name in shadowed:
            return
        if name in scope.locals:
            if name not in state:
                self.undefined.setdefault((scope.name, name), line)
            return
        defined = self._outer_state(scope, name)
        if defined is not None and name not in defined and name not in self.global_declared:
            self.undefined.setdefault((scope.name, name), line)

    @staticmethod
    def _outer_state(scope: _Scope, name: str) -> State:
        """What the scope that defines free `name` had bound when `scope` may read it: the module's at its
        end (at the class statement for class bodies run directly in it); an enclosing function's at the
        nested definition or at its end (a closure is usually called after the names it reads are set)."""
        child, outer, now = scope, scope.parent, not scope.is_function
        while outer is not None:
            if outer.is_module:
                if name not in outer.locals:
                    return None
                return outer.state_at_child.get(id(child.node)) if now else outer.exit_state
            if outer.is_function and name in outer.locals:
                at_def = outer.state_at_child.get(id(child.node))
                if now or at_def is None or outer.exit_state is None:
                    return at_def
                return at_def | outer.exit_state
            now = now and not outer.is_function
            child, outer = outer, outer.parent
        return None

    def expression(self, scope: _Scope, node: Optional[ast.AST], state: State,
                   shadowed: FrozenSet[str] = frozenset()) -> State:
        """Check the reads of `node`; return the state after it (walrus targets bound)."""
        if node is None or state is None:
            return state
        stack = [node]
        bound: Set[str] = set()
        while stack:
            current = stack.pop()
            if isinstance(current, ast.Name):
                if isinstance(current.ctx, ast.Load):
                    self.read(scope, current.id, current.lineno, state, shadowed)
            elif isinstance(current, ast.Lambda):
                self._defer(scope, current, state)
            elif isinstance(current, _COMPREHENSIONS):
                self._comprehension(scope, current, state, shadowed)
            elif isinstance(current, ast.NamedExpr):
                self.expression(scope, current.value, state, shadowed)
                if isinstance(current.target, ast.Name):
                    bound.add(current.target.id)
            else:
                stack.extend(ast.iter_child_nodes(current))
        return _add(state, bound)

    def _comprehension(self, scope: _Scope, node, state: State, shadowed: FrozenSet[str]) -> None:
        local = set(shadowed)
        for index, generator in enumerate(node.generators):
            self.expression(scope, generator.iter, state, frozenset(local) if index else shadowed)
            local.update(target_names(generator.target))
            for condition in generator.ifs:
                self.expression(scope, condition, state, frozenset(local))
        elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for element in elements:
            self.expression(scope, element, state, frozenset(local))

    def _defer(self, scope: _Scope, node: ast.AST, state: State) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            for default in [*arguments.defaults, *arguments.kw_defaults]:
                self.expression(scope, default, state)
        child = self.new_scope(node, scope)
        scope.state_at_child[id(node)] = state
        self.deferred.append((child, node))

    # --- statements ----------------------------------------------------------------------------------
    def block(self, scope: _Scope, statements, state: State, loop: Optional[dict]) -> State:
        for statement in statements:
            state = self.statement(scope, statement, state, loop)
        return state

    def statement(self, scope: _Scope, node: ast.stmt, state: State, loop: Optional[dict]) -> State:
        if state is None:
            return None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                self.expression(scope, decorator, state)
            self._defer(scope, node, state)
            return _add(state, [node.name])
        if isinstance(node, ast.ClassDef):
            for part in [*node.decorator_list, *node.bases, *(keyword.value for keyword in node.keywords)]:
                self.expression(scope, part, state)
            body = self.new_scope(node, scope)
            scope.state_at_child[id(node)] = state
            self.block(body, node.body, frozenset(), loop=None)
            return _add(state, [node.name])
        if isinstance(node, ast.Assign):
            state = self.expression(scope, node.value, state)
            for target in node.targets:
                state = self._store(scope, target, state)
            return state
        if isinstance(node, ast.AugAssign):
            state = self.expression(scope, node.value, state)
            if isinstance(node.target, ast.Name):
                self.read(scope, node.target.id, node.lineno, state, frozenset())
            return self._store(scope, node.target, state)
        if isinstance(node, ast.AnnAssign):
            if node.value is None:
                return state
            return self._store(scope, node.target, self.expression(scope, node.value, state))
        if isinstance(node, ast.Delete):
            for target in node.targets:
                if not isinstance(target, ast.Name):
                    self.expression(scope, target, state)
            return state - frozenset(name for target in node.targets for name in target_names(target))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return _add(state, [alias.asname or alias.name.split(".")[0] for alias in node.names if alias.name != "*"])
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            if isinstance(node, ast.Global):
                self.global_declared.update(node.names)
            return state
        if isinstance(node, ast.If):
            state = self.expression(scope, node.test, state)
            if _always_true(node.test) or (scope.is_module and _is_main_guard(node.test)):
                return self.block(scope, node.body, state, loop)
            return _meet(self.block(scope, node.body, state, loop), self.block(scope, node.orelse, state, loop))
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            return self._loop(scope, node, state)
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                state = self.expression(scope, item.context_expr, state)
                if item.optional_vars is not None:
                    state = self._store(scope, item.optional_vars, state)
            return self.block(scope, node.body, state, loop)
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            return self._try(scope, node, state, loop)
        if isinstance(node, ast.Match):
            return self._match(scope, node, state, loop)
        if isinstance(node, ast.Return):
            self.expression(scope, node.value, state)
            scope.returns.append(state)
            return None
        if isinstance(node, ast.Raise):
            self.expression(scope, node.exc, state)
            self.expression(scope, node.cause, state)
            return None
        if isinstance(node, (ast.Break, ast.Continue)):
            if loop is not None:
                loop["break" if isinstance(node, ast.Break) else "continue"].append(state)
            return None
        for child in ast.iter_child_nodes(node):  # Expr, Assert, Pass, ...
            state = self.expression(scope, child, state)
        return state

    def _store(self, scope: _Scope, target: ast.AST, state: State) -> State:
        """Bind a store target; the parts it reads (`a[i] = ...` reads a and i) are read first."""
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                state = self._store(scope, element, state)
            return state
        if isinstance(target, ast.Starred):
            return self._store(scope, target.value, state)
        if isinstance(target, ast.Attribute):
            return self.expression(scope, target.value, state)
        if isinstance(target, ast.Subscript):
            return self.expression(scope, target.slice, self.expression(scope, target.value, state))
        return _add(state, target_names(target))

    def _loop(self, scope: _Scope, node, state: State) -> State:
        context: dict = {"break": [], "continue": []}
        if isinstance(node, ast.While):
            state = self.expression(scope, node.test, state)
            entry = state
        else:
            state = self.expression(scope, node.iter, state)
            entry = self._store(scope, node.target, state)
        self.block(scope, node.body, entry, context)
        if isinstance(node, ast.While) and _always_true(node.test):
            return _meet(*context["break"]) if context["break"] else None
        after_else = self.block(scope, node.orelse, state, loop=None)
        return _meet(after_else, *context["break"]) if context["break"] else after_else

    def _try(self, scope: _Scope, node, state: State, loop: Optional[dict]) -> State:
        body_end = self.block(scope, node.body, state, loop)
        ends = [self.block(scope, node.orelse, body_end, loop)]
        for handler in node.handlers:
            self.expression(scope, handler.type, state)
            ends.append(self.block(scope, handler.body, _add(state, [handler.name] if handler.name else []), loop))
        merged = _meet(*ends)
        if not node.finalbody:
            return merged
        finally_end = self.block(scope, node.finalbody, state, loop)
        if merged is None or finally_end is None:
            return None
        return merged | (finally_end - state)

    def _match(self, scope: _Scope, node: ast.Match, state: State, loop: Optional[dict]) -> State:
        state = self.expression(scope, node.subject, state)
        last = node.cases[-1] if node.cases else None
        catch_all = last is not None and last.guard is None and isinstance(last.pattern, ast.MatchAs) \
            and last.pattern.pattern is None
        ends = [] if catch_all else [state]
        for case in node.cases:
            names = [inner.name for inner in ast.walk(case.pattern)
                     if isinstance(inner, (ast.MatchAs, ast.MatchStar)) and inner.name]
            names += [inner.rest for inner in ast.walk(case.pattern) if isinstance(inner, ast.MatchMapping) and inner.rest]
            entry = self.expression(scope, case.guard, _add(state, names))
            ends.append(self.block(scope, case.body, entry, loop))
        return _meet(*ends)


def undefined_reads(source: bytes) -> Dict[Read, int]:
    """{(scope, name): first line} for every read some path reaches with the name unbound."""
    return _Analyser().run(ast.parse(source))
