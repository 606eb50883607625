"""The weights `model.load_state_dict` writes into an O2 model, held until its optimizers' masters take them.

A load calls the pre-hook of every module it reaches (master_sync.MastersFollowLoads.read notes each
low-precision param's loaded value here) and the post-hook of each module when its part is done. The values
are handed to the masters when the outermost load ends; a load cut short by an exception (or one whose module
loads another inside it) hands them over at the next use of the masters instead, so nothing waits longer.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

Loaded = Dict[int, Tuple[torch.Tensor, torch.Tensor]]  # id(param) -> (param, the value a load wrote into it)


class ModelLoads:
    """Loads in progress in the session: the modules they were called on, and the values they wrote."""

    def __init__(self) -> None:
        self.roots: List[int] = []  # ids of the modules whose load_state_dict runs, outermost first
        self.values: Loaded = {}

    def begin(self, module: torch.nn.Module) -> None:
        self.roots.append(id(module))

    def note(self, param: torch.Tensor, value: torch.Tensor) -> None:
        self.values[id(param)] = (param, value)

    def end(self, module: torch.nn.Module) -> bool:
        """The post-hook of `module` ran: True when that ended the outermost load."""
        if self.roots and self.roots[-1] == id(module):
            self.roots.pop()
            return not self.roots
        return False

    def take(self) -> Loaded:
        """The values noted so far (forgotten here: no checkpoint tensor is kept alive past its hand-over)."""
        values, self.values, self.roots = self.values, {}, []
        return values
