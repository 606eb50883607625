"""Let nn.RNN/GRU/LSTM take fp16/bf16 input under O1, as apex did.

torch's `RNNBase.check_input` refuses an input whose dtype differs from the weights' unless
torch.autocast is on, so a Linear/Conv output (low precision under O1) fed to an fp32 LSTM fails
before the patched `_VF` kernels (which cast input, state and weights alike) are reached. Under O1
the dtype part of that check is moot; every other check (rank, input size) still runs, on a
zero-size stand-in of the weights' dtype and the input's shape.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from apexlite.amp.o1.cast_state import CastState
from apexlite.amp.o1.patcher import Patcher, raw_attribute

LOW_PRECISION = (torch.float16, torch.bfloat16)


def _checked_input(state: CastState, original: Callable) -> Callable:
    # functools.wraps gives it the original's module and qualified name, so it pickles (and copies) as
    # `torch.nn.RNNBase.check_input`, which is itself while O1 is installed and the original elsewhere
    @functools.wraps(original)
    def check_input(self: torch.nn.RNNBase, input: torch.Tensor, batch_sizes: Any) -> None:
        weights = self._flat_weights
        if (state.active and not state.thread.disabled_depth and isinstance(input, torch.Tensor)
                and input.dtype in LOW_PRECISION and weights and weights[0] is not None
                and weights[0].dtype in (torch.float32, *LOW_PRECISION)):
            stand_in = torch.empty((), dtype=weights[0].dtype, device=input.device).expand(input.shape)
            return original(self, stand_in, batch_sizes)
        return original(self, input, batch_sizes)

    return check_input


def patch_rnn_input_check(state: CastState, patcher: Patcher) -> None:
    """Install the O1 variant of `RNNBase.check_input` (recorded, so it is undone with the O1 patches)."""
    target = torch.nn.RNNBase
    if not hasattr(target, "check_input"):
        return
    original = raw_attribute(target, "check_input")
    patcher.set_attribute(target, "check_input", _checked_input(state, original))
