"""``multi_tensor_adagrad``: apex's fused Adagrad kernel, on :mod:`apexlite.optimizers._adagrad_rule`."""
from __future__ import annotations

import torch

from apexlite.optimizers._adagrad_rule import adagrad_update
from apexlite.optimizers.multi_tensor._lists import Lists, check_float_dtypes, check_lists

_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@torch.no_grad()
def multi_tensor_adagrad(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, lr: float, epsilon: float,
                         mode: int, weight_decay: float) -> None:
    """Adagrad over [grads, params, sums]; mode 0 adds L2 decay to the gradient, mode 1 decouples it.
    ``noop_flag`` is neither read nor set, as in apex."""
    grads, params, sums = check_lists(tensor_lists, (3,), "multi_tensor_adagrad")
    for what, tensors in (("grads", grads), ("params", params), ("sums", sums)):
        check_float_dtypes(tensors, _FLOATS, what, "multi_tensor_adagrad")
    adagrad_update(grads, params, sums, lr=lr, eps=epsilon, mode=mode, weight_decay=weight_decay)
