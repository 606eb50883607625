"""The one Adagrad update rule of apexlite, shared by ``FusedAdagrad`` and ``multi_tensor_adagrad``.

Per tensor, in float32 whatever the storage dtypes (apex's multi_tensor_adagrad):

    L2 (mode 0):         g += weight_decay * p;  h += g*g;  p -= lr * g / (sqrt(h) + eps)
    decoupled (mode 1):  h += g*g;  p -= lr * (g / (sqrt(h) + eps) + weight_decay * p)
"""
from __future__ import annotations

from typing import Sequence

import torch

L2_MODE, DECOUPLED_MODE = 0, 1


def adagrad_update(grads: Sequence[torch.Tensor], params: Sequence[torch.Tensor], sums: Sequence[torch.Tensor], *,
                   lr: float, eps: float, mode: int, weight_decay: float) -> None:
    """One Adagrad step over parallel lists, in place (see the module docstring for the rule)."""
    if mode not in (L2_MODE, DECOUPLED_MODE):
        raise ValueError(f"Adagrad mode must be 0 (L2) or 1 (decoupled weight decay); got {mode}.")
    for grad, param, accumulator in zip(grads, params, sums):
        g, p = grad.float(), param.float()
        if mode == L2_MODE and weight_decay != 0:
            g = g.add(p, alpha=weight_decay)
        h = accumulator.float().addcmul_(g, g)  # in place: the accumulator itself when it is float32
        update = g / h.sqrt().add_(eps)
        if mode == DECOUPLED_MODE and weight_decay != 0:
            update.add_(p, alpha=weight_decay)
        if p is param:
            param.add_(update, alpha=-lr)
        else:
            param.copy_(p.add_(update, alpha=-lr))
        if h is not accumulator:
            accumulator.copy_(h)
