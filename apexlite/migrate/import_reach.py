"""Which import a name bound by several imports of one scope stands for at a use: the nearest one before it in
the blocks around it (`if fp16: from apex.parallel import DDP ... else: from torch.nn.parallel import DDP`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from apexlite.migrate import apis
from apexlite.migrate.dotted import dotted_text

if TYPE_CHECKING:
    from apexlite.migrate.analysis import Analysis


def reached_by_apex_import(analysis: "Analysis", name: cst.Name) -> bool:
    """For a name bound by several imports (apex's in one branch, torch's in another): whether the nearest one
    before `name` in the blocks around it imports from apex (True where none is found that way)."""
    scope = analysis.scope(name)
    position = analysis.position(name)
    reaching = []
    for assignment in (scope[name.value] if scope is not None else ()):
        node = getattr(assignment, "node", None)
        if not isinstance(node, (cst.Import, cst.ImportFrom)) or analysis.position(node) > position:
            continue
        block = analysis.parent(analysis.statement_of(node))
        if block is not None and (isinstance(block, cst.Module) or analysis.within(name, block)):
            reaching.append(node)
    if not reaching:
        return True
    nearest = max(reaching, key=analysis.position)
    module = dotted_text(nearest.module) if isinstance(nearest, cst.ImportFrom) and nearest.module else ""
    return apis.is_apex_name(module) if isinstance(nearest, cst.ImportFrom) else any(
        apis.is_apex_name(dotted_text(alias.name) or "") for alias in nearest.names)
