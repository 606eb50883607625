"""`apex.multi_tensor_apply.multi_tensor_apply`: MultiTensorApply, which calls `amp_C` ops (see apexlite.compat.amp_C)."""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

DEFAULT_CHUNK_SIZE = 2048 * 32


class MultiTensorApply:
    """Calls `op(chunk_size, noop_flag_buffer, tensor_lists, *args)`; always available in apexlite."""

    available = True
    warned = False
    import_err: Optional[BaseException] = None

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size

    def check_avail(self) -> None:
        """Nothing to check: the ops run on torch foreach kernels, on every device."""

    def __call__(self, op: Callable[..., Any], noop_flag_buffer: torch.Tensor,
                 tensor_lists: Sequence[Sequence[torch.Tensor]], *args: Any) -> Any:
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)

