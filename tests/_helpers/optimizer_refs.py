"""Reference loops for apex's optimizer kernels, written from the arithmetic of apex's .cu files.

Each takes plain tensors and returns new ones (float32 math, nothing shared with apexlite), so a
test compares apexlite's kernels with the formula apex's kernels evaluate.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch


def adam(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *, lr: float, beta1: float,
         beta2: float, eps: float, step: int, mode: int, bias_correction: bool, wd: float):
    """apex's AdamFunctor: (p, m, v) after one step (mode 0: L2, mode 1: decoupled)."""
    c1 = 1 - beta1 ** step if bias_correction else 1.0
    c2 = 1 - beta2 ** step if bias_correction else 1.0
    p, g, m, v = p.float(), g.float(), m.float(), v.float()
    if mode == 0:
        g = g + wd * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    update = (m / c1) / ((v / c2).sqrt() + eps)
    if mode == 1:
        update = update + wd * p
    return p - lr * update, m, v


def sgd(w: torch.Tensor, g: torch.Tensor, buf: Optional[torch.Tensor], *, lr: float, momentum: float,
        dampening: float, wd: float, nesterov: bool, wd_after_momentum: bool, scale: float = 1.0):
    """apex's SGDFunctor: (w, buf) after one step; buf None means a first run."""
    g, w = g.float() * scale, w.float()
    if wd != 0 and not wd_after_momentum:
        g = g + wd * w
    if momentum != 0:
        buf = g.clone() if buf is None else buf.float() * momentum + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    if wd != 0 and wd_after_momentum:
        g = g + wd * w
    return w - lr * g, buf


def adagrad(p: torch.Tensor, g: torch.Tensor, h: torch.Tensor, *, lr: float, eps: float, mode: int, wd: float):
    """apex's AdagradFunctor: (p, h) after one step."""
    p, g, h = p.float(), g.float(), h.float()
    if mode == 0:
        g = g + wd * p
        h = h + g * g
        return p - lr * (g / (h.sqrt() + eps)), h
    h = h + g * g
    return p - lr * (g / (h.sqrt() + eps) + wd * p), h


def novograd(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], moments: Sequence[torch.Tensor],
             norms: torch.Tensor, *, lr: float, beta1: float, beta2: float, eps: float, step: int,
             bias_correction: bool, wd: float, grad_averaging: bool, mode: int, norm_type: int):
    """apex's norm_out blend + NovoGradFunctor: (params, moments, norms) after one step."""
    new_norms = []
    for g, n in zip(grads, norms.tolist()):
        if norm_type == 2:
            new_norms.append(math.sqrt(beta2 * n * n + (1 - beta2) * float(g.float().pow(2).sum())))
        else:
            new_norms.append(beta2 * n + (1 - beta2) * float(g.float().abs().max()))
    c1 = 1 - beta1 ** step if bias_correction else 1.0
    c2 = math.sqrt(1 - beta2 ** step) if bias_correction else 1.0
    beta3 = 1 - beta1 if grad_averaging else 1.0
    out_p, out_m = [], []
    for p, g, m, n in zip(params, grads, moments, new_norms):
        p, g, m = p.float(), g.float(), m.float()
        denom = n / c2 + eps
        if mode == 0:
            m = beta1 * m + beta3 * (g / denom + wd * p)
            p = p - lr * (m / c1)
        else:
            m = beta1 * m + beta3 * g
            p = p - lr * (m / c1 / denom + wd * p)
        out_p.append(p)
        out_m.append(m)
    return out_p, out_m, torch.tensor(new_norms)


def lamb(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], ms: Sequence[torch.Tensor],
         vs: Sequence[torch.Tensor], *, lr: float, beta1: float, beta2: float, eps: float, step: int,
         bias_correction: bool, wd: Sequence[float], grad_averaging: bool, mode: int, global_norm: float,
         max_norm: float, use_nvlamb: bool, adaptive_when: Optional[bool] = None) -> Tuple[List, List, List, List]:
    """apex's multi_tensor_lamb (stage 1 and 2): (params, ms, vs, updates) after one step.

    ``wd`` is per tensor; the trust ratio applies when ``adaptive_when`` (default: nvlamb or wd != 0).
    """
    clip = global_norm / max_norm if global_norm > max_norm else 1.0
    c1 = 1 - beta1 ** step if bias_correction else 1.0
    c2 = 1 - beta2 ** step if bias_correction else 1.0
    beta3 = 1 - beta1 if grad_averaging else 1.0
    out = ([], [], [], [])
    for p, g, m, v, decay in zip(params, grads, ms, vs, wd):
        p, g, m, v = p.float(), g.float() / clip, m.float(), v.float()
        if mode == 0:
            g = g + decay * p
        m = m * beta1 + beta3 * g
        v = v * beta2 + (1 - beta2) * g * g
        u = (m / c1) / ((v / c2).sqrt() + eps)
        if mode == 1:
            u = u + decay * p
        adaptive = (use_nvlamb or decay != 0) if adaptive_when is None else adaptive_when
        pn, un = float(p.norm()), float(u.norm())
        ratio = lr * pn / un if adaptive and pn != 0 and un != 0 else lr
        for store, value in zip(out, (p - ratio * u, m, v, u)):
            store.append(value)
    return out


def adam_2019(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *, lr: float, beta1: float,
              beta2: float, eps: float, step: int, bias_correction: bool, wd: float, scale: float,
              eps_inside_sqrt: bool = False):
    """apex's 2019 adam_cuda_kernel (contrib FusedAdam): (p, m, v) after one step."""
    g = g.float() / scale
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    denom = (v + eps).sqrt() if eps_inside_sqrt else v.sqrt() + eps
    step_size = lr * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step) if bias_correction else lr
    return p - step_size * (m / denom + wd * p), m, v
