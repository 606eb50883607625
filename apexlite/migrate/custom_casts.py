"""`amp.register_half_function(torch, "einsum")` and `register_float_function`: dropped, with a note, where
torch.autocast on CUDA already runs that op in the same precision (its own op lists, autocast_cuda_ops.tsv);
any other registration stays a TODO (amp_part.NATIVE_HINTS), since torch.autocast reads no user list.

apex's registration cast the function's float inputs whenever O1 was on; torch.autocast casts the ops of its
lists inside its regions, which a migrated script puts around the forward pass and the loss. Only a registration
of a torch function, Tensor method or torch.nn.functional function by its literal name is matched, by that name.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Dict, Optional

import libcst as cst

from apexlite.migrate.device import CUDA
from apexlite.migrate.edits import Plan

TABLE_PATH = Path(__file__).with_name("autocast_cuda_ops.tsv")
LOWER, FLOAT32 = "lower", "float32"
REGISTRATIONS = {"apex.amp.amp.register_half_function": LOWER, "apex.amp.amp.register_float_function": FLOAT32}
OP_HOLDERS = ("torch", "torch.Tensor", "torch.nn.functional")
SAID = {LOWER: "in its lower precision (float16, or bfloat16 where the script asks for it)", FLOAT32: "in float32"}


@functools.lru_cache(maxsize=None)
def cuda_op_precisions() -> Dict[str, str]:
    """torch.autocast's CUDA lists: op name -> LOWER or FLOAT32."""
    rows = (line.split("\t") for line in TABLE_PATH.read_text().splitlines() if line and not line.startswith("#"))
    return {op: precision for op, precision in rows}


def _holder(plan: Plan, node: cst.BaseExpression) -> Optional[str]:
    """Which of OP_HOLDERS `node` names (`torch`, `F` imported as torch.nn.functional, ...), if any."""
    names = {qualified.name for qualified in plan.analysis.qualified_names(node)}
    return next((holder for holder in OP_HOLDERS if holder in names), None)


def plan_registration(plan: Plan, api: str, call: Optional[cst.Call], device: str) -> bool:
    """Drop a registration that torch.autocast on CUDA already carries out (True); where the device is not known
    to be CUDA, a TODO that says so (True); else nothing (False: amp_part's TODO)."""
    wanted = REGISTRATIONS.get(api)
    if wanted is None or call is None or len(call.args) != 2 \
            or any(arg.keyword is not None or arg.star for arg in call.args):
        return False
    holder, name = (arg.value for arg in call.args)
    small = plan.analysis.small_statement_of(call)
    if not isinstance(name, cst.SimpleString) or not (isinstance(small, cst.Expr) and small.value is call):
        return False
    op = name.evaluated_value
    holder_name = _holder(plan, holder)
    if holder_name is None or cuda_op_precisions().get(op) != wanted:
        return False
    already = f"torch.autocast on CUDA already runs {holder_name}.{op} {SAID[wanted]}"
    if device != CUDA:
        plan.todo(call, f"{already}, but this script may run elsewhere, where autocast's lists differ: delete "
                        "this line if it trains on CUDA only, else cast the op's inputs where it is called")
        return True
    plan.comment(call, f"`{plan.analysis.code(call)}` removed: {already}")
    plan.replace_small(small, lambda _: [])
    return True
