"""amp.initialize in a method of a training class: `self.model, self.optimizer = amp.initialize(self.model,
self.optimizer, ...)` in `__init__`, `amp.scale_loss(loss, self.optimizer)` in `train_step`. The class's other
methods reach amp's optimizers, and the GradScaler that replaces amp (an attribute beside them), through their
own first parameter."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import libcst as cst

from apexlite.migrate.analysis import Analysis

_NOT_METHODS = ("staticmethod", "classmethod")


@dataclass(frozen=True)
class HomeClass:
    """The class whose method calls amp.initialize on attributes of its `self`."""

    node: cst.ClassDef
    self_name: str
    optimizer_attributes: Tuple[str, ...]

    def method_of(self, analysis: Analysis, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        """The method of this class whose own body holds `node` and names its first parameter as amp.initialize's
        method did; None elsewhere (a nested function, another class, module level)."""
        function = analysis.enclosing_scope_owner(node)
        if not isinstance(function, cst.FunctionDef) or _self_name(analysis, function) != self.self_name:
            return None
        block = analysis.parent(function)
        return function if block is not None and analysis.parent(block) is self.node else None

    def optimizer(self, analysis: Analysis, node: cst.CSTNode) -> Optional[int]:
        """The index of the amp optimizer `node` (`self.optimizer` in a method of this class) is, if it is one."""
        if not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)
                and node.value.value == self.self_name and self.method_of(analysis, node) is not None):
            return None
        name = node.attr.value
        return self.optimizer_attributes.index(name) if name in self.optimizer_attributes else None

    def attribute(self, name: str) -> str:
        return f"{self.self_name}.{name}"


def _self_name(analysis: Analysis, function: cst.FunctionDef) -> Optional[str]:
    decorators = {analysis.code(decorator.decorator).strip() for decorator in function.decorators}
    params = function.params.params
    if decorators & set(_NOT_METHODS) or not params:
        return None
    return params[0].name.value


def home_class(analysis: Analysis, call: cst.Call, optimizer_targets: Sequence[cst.CSTNode]) -> Optional[HomeClass]:
    """The HomeClass of an amp.initialize `call` that assigns only attributes of its method's first parameter."""
    function = analysis.enclosing_scope_owner(call)
    if not isinstance(function, cst.FunctionDef) or not optimizer_targets:
        return None
    block = analysis.parent(function)
    owner = analysis.parent(block) if block is not None else None
    self_name = _self_name(analysis, function)
    if not isinstance(owner, cst.ClassDef) or self_name is None:
        return None
    if not all(isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
               and target.value.value == self_name for target in optimizer_targets):
        return None
    return HomeClass(owner, self_name, tuple(target.attr.value for target in optimizer_targets))
