"""The status of legacy apex APIs in apexlite: what `python -m apexlite check` reports for a name.

apex and amp_C names get theirs from apex's module tree (apexlite.compat.apex_tree: every module path
and public name of apex with apexlite's status; read on first use). torch names matter only where O1
refuses them for fp16/bf16 inputs, as apex did: the banned functions of O1's op table
(apexlite/amp/o1/lists.py), and torch.nn.BCELoss, which calls one; `check` flags them wherever a
script uses them. MIGRATION.md's tables state the same statuses (tests/test_check.py walks them).
"""
from __future__ import annotations

from typing import Tuple

from apexlite.amp.o1.lists import TABLES
from apexlite.amp.o1.policies import CastPolicy
from apexlite.compat import apex_tree

SUPPORTED = apex_tree.SUPPORTED
DIFFERS = apex_tree.DIFFERS
UNSUPPORTED = apex_tree.UNSUPPORTED
REFUSED = apex_tree.REFUSED
RAISES_AT_O1 = "raises at O1"
RAISES = "raises"  # a call apexlite refuses whenever it runs, told from its literal arguments (initialize_scan)
KINDS = (SUPPORTED, DIFFERS, UNSUPPORTED, REFUSED, RAISES_AT_O1, RAISES)
FAILING = (UNSUPPORTED, REFUSED, RAISES_AT_O1, RAISES)  # a script using one of these exits `check` with status 1

NOT_IN_APEX = (f"{UNSUPPORTED}: not a module or name of apex (at e13873de, its last release with amp) nor one "
               "apexlite adds; check the spelling")
BCE_FIX = ("under O1 it raises for fp16/bf16 inputs, as in apex: feed logits to torch.nn.BCEWithLogitsLoss / "
           "F.binary_cross_entropy_with_logits, or call amp.register_float_function(torch, 'sigmoid') before "
           "amp.initialize (O0/O2/O3 are unaffected)")
# torch's gradient clipping functions by their last name: `check` and `migrate` both look for clips of grads
CLIP_FUNCTIONS = ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value")


def raising_at_o1() -> Tuple[str, ...]:
    """The torch APIs O1 refuses for fp16/bf16 inputs (`check` flags them wherever they are used)."""
    banned = tuple(f"{namespace}.{name}" for namespace, names in TABLES[CastPolicy.BANNED].items()
                   for name in names.split())
    return banned + ("torch.nn.BCELoss",)


def torch_status_text(api: str) -> str:
    """The status text of a torch API from `raising_at_o1()`."""
    if api not in raising_at_o1():
        raise KeyError(f"{api} is not a torch API O1 refuses")
    return f"{RAISES_AT_O1}: {BCE_FIX}"


def status_of(api: str) -> Tuple[str, str]:
    """(name as reported, status text) for a dotted apex / amp_C name a script uses.

    A name inside a module apexlite refuses is reported as that module (its import fails first); an
    attribute of an apex object (`amp._amp_state.loss_scalers`) as that object; a name apex's tree lacks
    as its first unknown component, called a possible misspelling.
    """
    tree = apex_tree.tree()
    refused = tree.outermost_refused(api)
    if refused is not None:
        return refused.name, tree.status_text(refused.name)
    row = tree.nearest(api)
    if row is None:
        return api.split(".")[0], NOT_IN_APEX
    if row.name == api or not row.is_module or row.same_as:
        return row.name, tree.status_text(row.name)
    return ".".join(api.split(".")[:row.name.count(".") + 2]), NOT_IN_APEX


def is_failing(status_text: str) -> bool:
    """Whether a status text counts against a script (`check` exits 1)."""
    return status_text.split(":", 1)[0] in FAILING
