"""O2's fp32 masters meet the model's weights once more, where apex first built them.

apex built its masters lazily, from the low-precision model weights, at the first backward (`scale_loss`),
`zero_grad` or `add_param_group`. apexlite builds them in `amp.initialize`, from the fp32 weights before
the cast. Whatever writes the model's weights in between would otherwise be undone by the first step,
which copies the masters into the model: `model.load_state_dict(...)` after `initialize` (fine-tuning from
weights alone), DDP's broadcast of rank 0's weights, a `Reducer` or a manual broadcast. So at that first
use, each master whose model param no longer holds the master's value rounded to the param's dtype is
rebuilt from that param, as apex would have built it; the others keep their fp32 precision. Loading an
optimizer checkpoint counts as that first use: it sets the masters itself.

The same check runs again at the first use after a `load_state_dict` of a model amp cast (a hook on each of
its modules with params re-arms it): a run that reloads its best weights mid-training keeps them, where
apex's next step reverted them. Writes by other means after the first use (`param.data.copy_(...)`) are
not seen: the masters are the truth, and `amp.master_params(optimizer)` is where to write.

With several processes (torch.distributed initialised, world size > 1) every master is rebuilt from its
model param at the first use, as apex did: DDP broadcast rank 0's weights into the others, so a rebuild of the changed ones
alone would leave rank 0 its fp32 weights and the others their rounded copies, and the ranks would part by
a rounding error. Masters restored from a checkpoint (carried into initialize) are kept either way.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.distributed as dist

from apexlite.amp.session import current_session


def rebuild_changed_masters(pairs: List[Tuple[torch.Tensor, torch.Tensor]], every: bool = False) -> int:
    """Copy each model param into its fp32 master where the param is no longer the master rounded to
    its dtype (`every`: into every master); returns how many were copied."""
    rebuilt = 0
    with torch.no_grad():
        for param, master in pairs:
            if every or not torch.equal(param, master.to(param.dtype)):
                master.copy_(param)
                rebuilt += 1
    return rebuilt


def several_processes() -> bool:
    """Whether torch.distributed runs more than one process (DDP may all-reduce grads across them)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class MasterSync:
    """Runs `rebuild_changed_masters` on an optimizer's (model param, master) pairs once, at its first use."""

    def __init__(self, pairs: Callable[[], List[Tuple[torch.Tensor, torch.Tensor]]], label: str,
                 carried: bool = False) -> None:
        self._pairs = pairs
        self._label = label
        self.done = False
        self.carried = carried  # the masters came from a checkpoint: only changed params rebuild theirs

    def rearm(self) -> None:
        """The model's weights were loaded: at the next use, rebuild the masters of the params that changed."""
        self.done = False
        self.carried = True

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        pairs = self._pairs()
        every = not self.carried and several_processes()
        rebuilt = rebuild_changed_masters(pairs, every=every)
        session = current_session(required=False)
        if session is None:
            return
        if every:
            session.info("%s: the %d fp32 master weights were rebuilt from the model's weights at the first backward, "
                         "as apex built them, so every process starts from the same ones", self._label, len(pairs))
        elif rebuilt:
            session.info("%s: %d of %d model params were written after amp.initialize or a load_state_dict (loaded "
                         "weights, a broadcast); their fp32 master weights were rebuilt from them", self._label,
                         rebuilt, len(pairs))


class MastersFollowLoads:
    """The ``load_state_dict`` post-hook on each module of an O2 model: re-arms the check above. It holds its
    session weakly, and a copied or unpickled model (``copy.deepcopy``, ``torch.save(model)``, an EMA copy)
    gets an inert one: the copy's params are no optimizer's, and the session itself cannot be copied."""

    def __init__(self, session: Optional[Any]) -> None:
        self._session = weakref.ref(session) if session is not None else None

    def __call__(self, module: torch.nn.Module, incompatible: Any) -> None:
        session = self._session() if self._session is not None else None
        if session is not None and not session.closed:
            session.weights_loaded(module, incompatible)

    def __reduce__(self) -> tuple:
        return (MastersFollowLoads, (None,))

    def __deepcopy__(self, memo: dict) -> "MastersFollowLoads":
        return MastersFollowLoads(None)
