"""What `check` can tell about what a script hands `amp.initialize`: a model already made half (`.half()`,
`.bfloat16()`, `.to(torch.float16)`) or an optimizer already wrapped by FP16_Optimizer, both of which
amp.initialize refuses when it runs, as apex did.

Names are followed within the function (or module) that calls initialize, by the last binding before the
call. When that binding sits under a condition the call does not (`if args.fp16: model.half()`), the row
says initialize raises *if* it ran, without counting against the script: many scripts keep such branches
apart.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from apexlite import api_status

Row = Tuple[str, List[int], str]
_HALF_METHODS = ("half", "bfloat16")
_HALF_DTYPES = ("float16", "half", "bfloat16")
_CONDITIONAL = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler)


@dataclass
class _Binding:
    line: int
    conditions: Tuple[int, ...]  # ids of the conditional statements it sits under
    what: Optional[str]  # "half" / "FP16_Optimizer" when the binding makes one, else None (a plain rebinding)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return node.id if isinstance(node, ast.Name) else ""


def _is_half_dtype(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and _dotted(node.value) == "torch" and node.attr in _HALF_DTYPES


def _halving_root(node: ast.AST) -> Optional[Tuple[ast.AST, bool]]:
    """(the chain's root, whether the chain halves it) for a method chain like `Net().cuda().half()`."""
    halves = False
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        method = node.func.attr
        if method in _HALF_METHODS and not node.args and not node.keywords:
            halves = True
        elif method == "to" and any(_is_half_dtype(arg) for arg in
                                    [*node.args, *(keyword.value for keyword in node.keywords)]):
            halves = True
        node = node.func.value
    return node, halves


def _statements(body: List[ast.stmt], conditions: Tuple[int, ...]) -> Iterator[Tuple[ast.stmt, Tuple[int, ...]]]:
    """Every statement of a scope (not of the functions and classes it defines), with its conditions."""
    for statement in body:
        yield statement, conditions
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        inner = conditions + (id(statement),) if isinstance(statement, _CONDITIONAL) else conditions
        for name in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(statement, name, []), inner)
        for handler in getattr(statement, "handlers", []):
            yield from _statements(handler.body, conditions + (id(handler),))


def _bindings(body: List[ast.stmt], makes_fp16_optimizer: Callable[[ast.AST], bool]) -> Dict[str, List[_Binding]]:
    """name -> its bindings in the scope, in source order (`model.half()` counts as one of `model`)."""
    found: Dict[str, List[_Binding]] = {}
    for statement, conditions in _statements(body, ()):
        if isinstance(statement, ast.Expr):
            root, halves = _halving_root(statement.value)
            if halves and _dotted(root):
                found.setdefault(_dotted(root), []).append(_Binding(statement.lineno, conditions, "half"))
        elif isinstance(statement, ast.Assign):
            root, halves = _halving_root(statement.value)
            what = "half" if halves else "FP16_Optimizer" if makes_fp16_optimizer(statement.value) else None
            targets = [target for outer in statement.targets
                       for target in (outer.elts if isinstance(outer, ast.Tuple) else [outer])]
            if len(targets) > 1 and what is not None:
                continue  # `a, b = x.half(), y`: not followed
            for target in targets:
                if _dotted(target):
                    found.setdefault(_dotted(target), []).append(_Binding(statement.lineno, conditions, what))
            if halves and _dotted(root) and statement.value is not root:
                found.setdefault(_dotted(root), []).append(_Binding(statement.lineno, conditions, "half"))
    return found


def _argument(call: ast.Call, position: int, keyword: str) -> Optional[ast.AST]:
    if len(call.args) > position:
        return call.args[position]
    return next((item.value for item in call.keywords if item.arg == keyword), None)


def _scopes(tree: ast.Module) -> Iterator[List[ast.stmt]]:
    yield tree.body
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.body


def problems(tree: ast.Module, is_initialize: Callable[[ast.AST], bool],
             makes_fp16_optimizer: Callable[[ast.AST], bool], row_name: str) -> List[Row]:
    """Rows for initialize calls given a half model or an FP16_Optimizer (see the module docstring)."""
    rows: List[Row] = []
    for body in _scopes(tree):
        bindings = _bindings(body, makes_fp16_optimizer)
        for statement, conditions in _statements(body, ()):
            for call in _calls_in(statement):
                if is_initialize(call.func):
                    rows.extend(_rows_for(call, conditions, bindings, makes_fp16_optimizer, row_name))
    return rows


def _calls_in(statement: ast.stmt) -> Iterator[ast.Call]:
    if isinstance(statement, (ast.Expr, ast.Assign, ast.AnnAssign, ast.Return)) and statement.value is not None:
        yield from (node for node in ast.walk(statement.value) if isinstance(node, ast.Call))


def _rows_for(call: ast.Call, conditions: Tuple[int, ...], bindings: Dict[str, List[_Binding]],
              makes_fp16_optimizer: Callable[[ast.AST], bool], row_name: str) -> List[Row]:
    rows = []
    for position, keyword, what in ((0, "models", "half"), (1, "optimizers", "FP16_Optimizer")):
        given = _argument(call, position, keyword)
        items = given.elts if isinstance(given, (ast.List, ast.Tuple)) else [given] if given is not None else []
        for item in items:
            root, halves = _halving_root(item)
            made_here = halves if what == "half" else makes_fp16_optimizer(item)
            if made_here:
                rows.append((row_name, [call.lineno], f"{api_status.RAISES}: amp.initialize raises here: "
                                                      f"{_why(what, call.lineno)}"))
                continue
            earlier = [b for b in bindings.get(_dotted(item), []) if b.line < call.lineno]
            if not earlier or earlier[-1].what != what:
                continue
            binding = earlier[-1]
            if set(binding.conditions) <= set(conditions):
                rows.append((row_name, [call.lineno], f"{api_status.RAISES}: amp.initialize raises here: "
                                                      f"{_why(what, binding.line)}"))
            else:
                rows.append((row_name, [call.lineno], f"{api_status.DIFFERS}: amp.initialize raises here if "
                                                      f"line {binding.line} ran first (it sits under a "
                                                      f"condition this call does not): {_why(what, binding.line)}"))
    return rows


def _why(what: str, line: int) -> str:
    if what == "half":
        return (f"the model it is given was made half (line {line}); amp.initialize takes the fp32 model and "
                "casts it itself at O2/O3: drop the .half()/.to(torch.float16) before it")
    return (f"the optimizer it is given is an FP16_Optimizer (line {line}); amp.initialize takes the bare "
            "optimizer and does the loss scaling and fp32 masters itself: pass the optimizer FP16_Optimizer wraps")
