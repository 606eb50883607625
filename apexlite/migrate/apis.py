"""Which apex API a dotted name is, in the words of apex's module tree (the table `check` reads).

A script may reach one API under many names (`amp.scale_loss`, `apex.amp.handle.scale_loss`, a
re-export); the tree's `same_as` column names the object each one is. Every rule of `migrate` is keyed by
that canonical name, so `check` and `migrate` agree on what a name is. No libcst here: pure lookups.
"""
from __future__ import annotations

from typing import Tuple

from apexlite import api_status
from apexlite.compat import apex_tree

ROOTS = ("apex", "amp_C")

# The canonical names migrate rewrites (each is a row of apexlite/compat/apex_tree.tsv; a test checks).
INITIALIZE = "apex.amp.frontend.initialize"
SCALE_LOSS = "apex.amp.handle.scale_loss"
MASTER_PARAMS = "apex.amp._amp_state.master_params"
STATE_DICT = "apex.amp.frontend.state_dict"
LOAD_STATE_DICT = "apex.amp.frontend.load_state_dict"
AMP_STATE = "apex.amp._amp_state"
AMP_MODULE = "apex.amp"
LOSS_SCALERS = AMP_STATE + ".loss_scalers"


def apexlite_amp_names() -> Tuple[str, ...]:
    """What `from apexlite import amp` offers: the names O2 scripts kept on apexlite may use."""
    import apexlite.amp

    return tuple(apexlite.amp.__all__)


APEX_DDP = "apex.parallel.distributed.DistributedDataParallel"  # apex's DDP, as canonical() names it


def is_apex_name(dotted: str) -> bool:
    return dotted.split(".")[0] in ROOTS


def canonical(dotted: str) -> str:
    """The name of the object `dotted` reaches: re-exports followed to their definition, attributes kept.

    `apex.amp.scale_loss` -> `apex.amp.handle.scale_loss`; `apex.amp._amp_state.loss_scalers` stays (an
    attribute of the state module's object); names the tree lacks come back unchanged.
    """
    tree = apex_tree.tree()
    parts = dotted.split(".")
    for depth in range(len(parts), 0, -1):
        row = tree.row(".".join(parts[:depth]))
        if row is None:
            continue
        seen = {row.name}
        while not row.is_module and row.same_as and row.same_as not in seen:
            target = tree.row(row.same_as)
            if target is None:
                break
            seen.add(target.name)
            row = target
        return ".".join([row.name, *parts[depth:]])
    return dotted


def status(dotted: str) -> Tuple[str, str]:
    """(name as `check` reports it, its status text), exactly what `check` prints for this name."""
    return api_status.status_of(dotted)


def star_names(module: str) -> Tuple[str, ...]:
    """The names `from module import *` binds for an apex module (none for a module apex lacks)."""
    tree = apex_tree.tree()
    row = tree.row(module)
    return tuple(tree.star_names(module)) if row is not None and row.is_module else ()
