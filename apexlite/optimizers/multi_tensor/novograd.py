"""``multi_tensor_novograd``: apex's fused NovoGrad kernel, on :mod:`apexlite.optimizers._novograd_rule`."""
from __future__ import annotations

import torch

from apexlite.optimizers._novograd_rule import novograd_update
from apexlite.optimizers.multi_tensor._lists import Lists, check_float_dtypes, check_lists, raise_flag_if_non_finite

_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@torch.no_grad()
def multi_tensor_novograd(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, grad_norms: torch.Tensor,
                          lr: float, beta1: float, beta2: float, epsilon: float, step: int, bias_correction: int,
                          weight_decay: float, grad_averaging: int, mode: int, norm_type: int) -> None:
    """NovoGrad over [grads, params, exp_avgs]. ``grad_norms`` (float32, one per tensor) is blended with
    the new gradient norms in place first; ``noop_flag`` is raised when that norm is inf/NaN."""
    grads, params, exp_avgs = check_lists(tensor_lists, (3,), "multi_tensor_novograd")
    for what, tensors in (("grads", grads), ("params", params), ("exp_avgs", exp_avgs)):
        check_float_dtypes(tensors, _FLOATS, what, "multi_tensor_novograd")
    novograd_update(grads, params, exp_avgs, grad_norms, lr=lr, beta1=beta1, beta2=beta2, eps=epsilon, step=step,
                    bias_correction=bool(bias_correction), weight_decay=weight_decay,
                    grad_averaging=bool(grad_averaging), moment_mode=mode, norm_type=norm_type)
    raise_flag_if_non_finite(noop_flag, grad_norms)
