"""The dotted text of a Name/Attribute chain (`self.model.fc`) and its base name: what every part of migrate
matches code by."""
from __future__ import annotations

from typing import Optional

import libcst as cst


def dotted_text(node: cst.CSTNode) -> Optional[str]:
    """`a.b.c` for a pure Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted_text(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def base_name(node: cst.CSTNode) -> Optional[cst.Name]:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node if isinstance(node, cst.Name) else None
