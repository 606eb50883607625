"""``multi_tensor_sgd``: apex's fused SGD kernel, on apexlite's SGD rule (:mod:`apexlite.optimizers._sgd_rule`)."""
from __future__ import annotations

import torch

from apexlite.optimizers._sgd_rule import sgd_update
from apexlite.optimizers.multi_tensor._lists import Lists, check_float_dtypes, check_lists, noop_is_set

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_HALVES = (torch.float16, torch.bfloat16)


@torch.no_grad()
def multi_tensor_sgd(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, wd: float, momentum: float,
                     dampening: float, lr: float, nesterov: bool, first_run: bool, wd_after_momentum: bool,
                     scale: float) -> None:
    """SGD over [grads, weights, momenta] (+ [half model copies of the weights]); grads are multiplied
    by ``scale`` first. Skips everything while ``noop_flag`` is raised, as apex's kernel does.

    apex accepted only fp16/fp32 combinations; bfloat16 grads, weights and copies work here too.
    """
    lists = check_lists(tensor_lists, (3, 4), "multi_tensor_sgd")
    check_float_dtypes(lists[0], _FLOATS, "grads", "multi_tensor_sgd")
    check_float_dtypes(lists[1], _FLOATS, "weights", "multi_tensor_sgd")
    check_float_dtypes(lists[2], _FLOATS, "momenta", "multi_tensor_sgd")
    if len(lists) == 4:
        check_float_dtypes(lists[3], _HALVES, "model copies (the 4th list)", "multi_tensor_sgd")
    if noop_is_set(noop_flag):
        return
    sgd_update(lists[0], lists[1], lists[2], lists[3] if len(lists) == 4 else None, weight_decay=wd,
               momentum=momentum, dampening=dampening, lr=lr, nesterov=nesterov, first_run=first_run,
               wd_after_momentum=wd_after_momentum, scale=scale)
