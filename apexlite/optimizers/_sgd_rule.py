"""The one SGD update rule of apexlite, shared by ``FusedSGD`` and the ``multi_tensor_sgd`` kernel.

Per tensor, in float32 whatever the storage dtypes (the order of apex's multi_tensor_sgd):

    g = grad * scale
    g += weight_decay * w                 (unless wd_after_momentum)
    buf = g on a first run, else momentum * buf + (1 - dampening) * g   (when momentum != 0)
    g = g + momentum * buf (nesterov) or g = buf
    g += weight_decay * w                 (when wd_after_momentum)
    w -= lr * g;  copy = w (rounded, when a model copy is given)

The step uses the unrounded new momentum; the stored buffer keeps its own dtype.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch


def sgd_update(grads: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], momenta: Sequence[torch.Tensor],
               model_copies: Optional[Sequence[torch.Tensor]] = None, *, weight_decay: float, momentum: float,
               dampening: float, lr: float, nesterov: bool, first_run: bool, wd_after_momentum: bool,
               scale: float = 1.0) -> None:
    """One SGD step over parallel lists, in place (see the module docstring for the rule)."""
    copies = model_copies if model_copies else [None] * len(weights)
    for grad, weight, buf, copy in zip(grads, weights, momenta, copies):
        g = grad.float() * scale if scale != 1.0 else grad.float()
        w = weight.float()
        if weight_decay != 0 and not wd_after_momentum:
            g = g.add(w, alpha=weight_decay)
        if momentum != 0:
            new_buf = _next_momentum(buf, g, momentum, dampening, first_run)
            g = g.add(new_buf, alpha=momentum) if nesterov else new_buf
        if weight_decay != 0 and wd_after_momentum:
            g = g.add(w, alpha=weight_decay)
        if w is weight:
            weight.add_(g, alpha=-lr)
        else:
            weight.copy_(w.add_(g, alpha=-lr))
        if copy is not None:
            copy.copy_(w)


def _next_momentum(buf: torch.Tensor, g: torch.Tensor, momentum: float, dampening: float,
                   first_run: bool) -> torch.Tensor:
    """The new float32 momentum; ``buf`` receives it in its own dtype."""
    if first_run:
        buf.copy_(g)
        return g
    if buf.dtype == torch.float32:
        return buf.mul_(momentum).add_(g, alpha=1 - dampening)
    new_buf = buf.float().mul_(momentum).add_(g, alpha=1 - dampening)
    buf.copy_(new_buf)
    return new_buf
