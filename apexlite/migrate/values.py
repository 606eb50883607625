"""Values a script fixes in its text: literals, torch dtypes by name, call arguments bound to a signature,
and the argparse default behind `args.<name>` (quoted in TODOs about run-time choices).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import libcst as cst

from apexlite.migrate.analysis import Analysis, dotted_text

_TORCH_DTYPES = {"float16": "float16", "half": "float16", "bfloat16": "bfloat16", "float32": "float32",
                 "float": "float32"}
NOT_LITERAL = object()


def literal(analysis: Analysis, node: Optional[cst.BaseExpression]) -> Any:
    """The value of a literal expression (numbers, strings, True/False/None, tuples, torch.<dtype> as the
    dtype's name, e.g. "bfloat16"); NOT_LITERAL for anything decided at run time."""
    if node is None:
        return None
    text = dotted_text(node)
    if text is not None and text.startswith("torch.") and text[len("torch."):] in _TORCH_DTYPES:
        return _TORCH_DTYPES[text[len("torch."):]]
    try:
        return ast.literal_eval(analysis.code(node).strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return NOT_LITERAL


@dataclass
class BoundCall:
    """A call's arguments by parameter name, or why they could not be bound."""

    arguments: Dict[str, cst.Arg]
    error: Optional[str] = None

    def value(self, name: str) -> Optional[cst.BaseExpression]:
        arg = self.arguments.get(name)
        return None if arg is None else arg.value


def bind(call: cst.Call, positional: Sequence[str], keyword_only: Sequence[str] = ()) -> BoundCall:
    """Bind `call`'s arguments to a signature given by its parameter names (no *args/**kwargs allowed)."""
    arguments: Dict[str, cst.Arg] = {}
    for index, arg in enumerate(call.args):
        if arg.star:
            return BoundCall({}, f"it passes {arg.star}-arguments, whose names are only known at run time")
        if arg.keyword is None:
            if index >= len(positional):
                return BoundCall({}, f"it passes {index + 1} positional arguments; the API takes {len(positional)}")
            name = positional[index]
        else:
            name = arg.keyword.value
            if name not in positional and name not in keyword_only:
                return BoundCall({}, f"it passes an argument `{name}` the API does not have")
        if name in arguments:
            return BoundCall({}, f"it passes `{name}` twice")
        arguments[name] = arg
    return BoundCall(arguments)


def elements(node: cst.BaseExpression) -> Optional[List[cst.BaseExpression]]:
    """The items of a list/tuple display, or [node] for anything else; None when an item is starred."""
    if isinstance(node, (cst.List, cst.Tuple)):
        items = []
        for element in node.elements:
            if isinstance(element, cst.StarredElement):
                return None
            items.append(element.value)
        return items
    return [node]


def _argparse_option(analysis: Analysis, attribute: str) -> Optional[cst.Call]:
    """The `add_argument(...)` call that stores into `attribute` (`--opt-level`, `--opt_level`, dest=)."""
    for call in analysis.walk(analysis.module, cst.Call):
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
            continue
        flags = [literal(analysis, arg.value) for arg in call.args if arg.keyword is None]
        dest = next((literal(analysis, arg.value) for arg in call.args
                     if arg.keyword is not None and arg.keyword.value == "dest"), None)
        names = {flag.lstrip("-").replace("-", "_") for flag in flags if isinstance(flag, str)}
        if attribute == dest or attribute in names:
            return call
    return None


def _keyword(call: cst.Call, name: str) -> Optional[cst.BaseExpression]:
    return next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def argparse_default(analysis: Analysis, attribute: str) -> Tuple[bool, Any]:
    """(found, default) of the argparse option stored in `attribute` (`--opt-level`, `--opt_level`)."""
    call = _argparse_option(analysis, attribute)
    if call is None:
        return False, None
    value = literal(analysis, _keyword(call, "default"))
    return value is not NOT_LITERAL, value


def argparse_action(analysis: Analysis, attribute: str) -> Optional[str]:
    """The literal `action=` of the argparse option stored in `attribute`, if there is one."""
    call = _argparse_option(analysis, attribute)
    action = literal(analysis, _keyword(call, "action")) if call is not None else None
    return action if isinstance(action, str) else None
