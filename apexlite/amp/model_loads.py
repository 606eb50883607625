"""The weights `model.load_state_dict` writes into an O2 model, held until its optimizers' masters take them.

A load calls the pre-hook of every module it reaches (master_sync.MastersFollowLoads.read notes each
low-precision param's loaded value here) and the post-hook of each module when its part is done. The values
are handed to the masters when the outermost load ends: the load called on a registered model, or on a module
holding one (a DDP-style wrapper, torch.compile's OptimizedModule). Each thread keeps its own loads. A load cut
short by an exception is found out by the next load in its thread (its `load_state_dict` is no longer running)
and at the next use of the masters, which take its values then.
"""
from __future__ import annotations

import sys
import threading
import types
from typing import Dict, List, Optional, Tuple

import torch

Loaded = Dict[int, Tuple[torch.Tensor, torch.Tensor]]  # id(param) -> (param, the value a load wrote into it)

_LOAD_STATE_DICT = torch.nn.Module.load_state_dict.__code__


def _running_load() -> Optional[types.FrameType]:
    """The frame of the innermost `Module.load_state_dict` call running in this thread (None: none is)."""
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None and frame.f_code is not _LOAD_STATE_DICT:
        frame = frame.f_back
    return frame


def _on_stack(frame: types.FrameType) -> bool:
    current: Optional[types.FrameType] = sys._getframe(1)
    while current is not None:
        if current is frame:
            return True
        current = current.f_back
    return False


class ModelLoads(threading.local):
    """This thread's loads in progress: the modules they were called on (with their load_state_dict frames),
    and the values they wrote."""

    def __init__(self) -> None:
        self.roots: List[Tuple[int, Optional[types.FrameType]]] = []  # outermost first
        self.values: Loaded = {}

    def begin(self, module: torch.nn.Module) -> bool:
        """A load of `module` starts here; True when loads cut short before it left values to hand over first."""
        cut_short = bool(self.roots) and not all(frame is not None and _on_stack(frame) for _, frame in self.roots)
        if cut_short:
            self.roots = [root for root in self.roots if root[1] is not None and _on_stack(root[1])]
        self.roots.append((id(module), _running_load()))
        return cut_short and bool(self.values) and len(self.roots) == 1

    def note(self, param: torch.Tensor, value: torch.Tensor) -> None:
        self.values[id(param)] = (param, value)

    def end(self, module: torch.nn.Module) -> bool:
        """The post-hook of `module` ran: True when that ended the outermost load."""
        if self.roots and self.roots[-1][0] == id(module):
            self.roots.pop()
            return not self.roots
        return False

    def take(self) -> Loaded:
        """The values noted so far (forgotten here: no checkpoint tensor is kept alive past its hand-over)."""
        values, self.values = self.values, {}
        if not any(frame is not None and _on_stack(frame) for _, frame in self.roots):
            self.roots = []
        return values
