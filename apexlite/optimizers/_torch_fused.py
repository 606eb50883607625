"""FusedAdam with nothing compiled: torch's own fused multi-tensor Adam/AdamW ops.

NOTE [torch fused path]
- ``torch._fused_adam_`` / ``torch._fused_adamw_`` take lists that share one dtype. Every call here
  runs them in float32: float32 lists go in as they are; fp16/bf16 lists (half grads, half params
  without masters, bf16 moments) are widened into float32 scratch tensors with one foreach copy per
  list, and the lists the step updates are narrowed back with one foreach copy each. O2 masters
  (``model_copies``) are the chain torch users write by hand: widen the half grads, update the fp32
  masters, copy them to the half weights; here it is one call per (device, dtypes) bucket.
- Nothing waits for the device: ``grad_scale`` and ``found_inf`` stay tensors on the device, the
  step counters are advanced before the op (it reads the new count) and ``found_inf`` is subtracted
  afterwards, as torch.optim.Adam(fused=True) does. torch's op skips its work only when found_inf is
  exactly 1, so any nonzero flag is first turned into 1 on the device.
- With a ``grad_scale`` torch's op writes grad / grad_scale back into the grads it is given. The
  caller's grads receive them only with ``unscale_grads`` (GradScaler's contract); otherwise float32
  grads are passed as scratch copies. On a skipped step the widened copies are unchanged, so
  narrowing them back rewrites every tensor with its own bits; only an O2 half weight is rewritten
  from its (unchanged) master, which FusedAdam keeps equal to the weight rounded.
- ``bias_correction=False``: torch's op always corrects; it gets counters holding +inf, for which
  1 - beta**inf is exactly 1.
- Numerics: torch's kernel evaluates the same formula in a different order (e.g. its CPU kernel
  divides ``step_size * exp_avg`` by the denominator, its CUDA kernel uses ``beta1 * m + (1 - beta1) *
  g``), so results agree with apexlite's kernels and reference to float32 rounding, not bit for bit.
"""
from __future__ import annotations

import functools
from typing import List, Optional

import torch

OP_NAMES = ("_fused_adam_", "_fused_adamw_")


@functools.lru_cache(maxsize=None)
def available(device_type: str) -> bool:
    """Whether this torch has a fused Adam kernel for ``device_type`` (CPU support came after CUDA's)."""
    if not all(hasattr(torch, name) for name in OP_NAMES):
        return False
    try:
        one = torch.zeros(1, device=device_type)
        torch._fused_adamw_([one], [one.clone()], [one.clone()], [one.clone()], [], [torch.ones((), device=device_type)],
                            lr=0.0, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def _copy(targets: List[torch.Tensor], sources: List[torch.Tensor]) -> None:
    """targets[i].copy_(sources[i]) for all i, in one foreach call where this torch has it."""
    foreach_copy = getattr(torch, "_foreach_copy_", None)
    if foreach_copy is not None:
        foreach_copy(targets, sources)
        return
    for target, source in zip(targets, sources):
        target.copy_(source)


def _float32(tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """``tensors`` themselves when float32, else float32 copies with the same layout."""
    if not tensors or tensors[0].dtype == torch.float32:
        return tensors
    widened = [torch.empty_like(t, dtype=torch.float32) for t in tensors]
    _copy(widened, tensors)
    return widened


def torch_fused_adam_step(
    params: List[torch.Tensor],
    grads: List[torch.Tensor],
    exp_avgs: List[torch.Tensor],
    exp_avg_sqs: List[torch.Tensor],
    state_steps: List[torch.Tensor],
    model_copies: List[torch.Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction: bool,
    adam_w_mode: bool,
    grad_scale: Optional[torch.Tensor] = None,
    found_inf: Optional[torch.Tensor] = None,
    unscale_grads: bool = False,
) -> None:
    """The ``apexlite::fused_adam_`` contract on torch's fused ops (see NOTE [torch fused path])."""
    if not params:
        return
    if found_inf is not None:
        found_inf = (found_inf != 0).to(torch.float32).reshape(())
    work = [_float32(params), _float32(grads), _float32(exp_avgs), _float32(exp_avg_sqs)]
    if grad_scale is not None and not unscale_grads and work[1] is grads:
        work[1] = [g.clone() for g in grads]  # torch's op writes the unscaled grads into what it gets
    torch._foreach_add_(state_steps, 1.0)
    steps = state_steps
    if not bias_correction:
        steps = [torch.full((), float("inf"), device=params[0].device)] * len(params)
    op = torch._fused_adamw_ if adam_w_mode else torch._fused_adam_
    op(*work, [], steps, lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=False,
       maximize=False, grad_scale=grad_scale, found_inf=found_inf)
    if found_inf is not None:
        torch._foreach_sub_(state_steps, [found_inf] * len(state_steps))
    for stored, updated in zip((params, exp_avgs, exp_avg_sqs), (work[0], work[2], work[3])):
        if updated is not stored:
            _copy(stored, updated)
    if model_copies:
        _copy(model_copies, work[0])
    if grad_scale is not None and unscale_grads and work[1] is not grads:
        _copy(grads, work[1])
