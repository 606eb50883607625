"""O2's fp32 masters meet the model's weights once more, where apex first built them.

apex built its masters lazily, from the low-precision model weights, at the first backward (`scale_loss`),
`zero_grad` or `add_param_group`. apexlite builds them in `amp.initialize`, from the fp32 weights before
the cast. Whatever writes the model's weights in between would otherwise be undone by the first step,
which copies the masters into the model: `model.load_state_dict(...)` after `initialize` (fine-tuning from
weights alone), DDP's broadcast of rank 0's weights, a `Reducer` or a manual broadcast. So at that first
use, each master whose model param no longer holds the master's value rounded to the param's dtype is
rebuilt from that param, as apex would have built it; the others keep their fp32 precision. Loading an
optimizer checkpoint counts as that first use: it sets the masters itself.
"""
from __future__ import annotations

from typing import Callable, List, Tuple

import torch

from apexlite.amp.session import current_session


def rebuild_changed_masters(pairs: List[Tuple[torch.Tensor, torch.Tensor]]) -> int:
    """Copy each model param into its fp32 master where the param is no longer the master rounded to
    its dtype; returns how many masters were rebuilt."""
    rebuilt = 0
    with torch.no_grad():
        for param, master in pairs:
            if not torch.equal(param, master.to(param.dtype)):
                master.copy_(param)
                rebuilt += 1
    return rebuilt


class MasterSync:
    """Runs `rebuild_changed_masters` on an optimizer's (model param, master) pairs once, at its first use."""

    def __init__(self, pairs: Callable[[], List[Tuple[torch.Tensor, torch.Tensor]]], label: str) -> None:
        self._pairs = pairs
        self._label = label
        self.done = False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        pairs = self._pairs()
        rebuilt = rebuild_changed_masters(pairs)
        session = current_session(required=False)
        if rebuilt and session is not None:
            session.info("%s: %d of %d model params were written after amp.initialize (loaded weights, a broadcast); "
                     "their fp32 master weights were rebuilt from them, as apex built its masters at the first "
                     "backward", self._label, rebuilt, len(pairs))
