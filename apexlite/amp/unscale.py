"""Unscale gradients in place and flag inf/NaN on the device, with no host sync, for any grad list.

Two routes with one contract (grads multiplied by `inv_scale`, in fp32 arithmetic rounded once to
the grad's dtype; `found_inf` set to 1.0 when any scaled grad held inf/NaN, never reset):

- "fused": torch's `_amp_foreach_non_finite_check_and_unscale_`, one pass per group;
- "foreach": an inf-norm per grad (non-finite iff the grad holds inf/NaN) and `_foreach_mul_` by the
  0-dim scale, for what the fused op refuses.

`FUSED_DTYPES` says which grad dtypes torch's fused op takes per device type: its CUDA kernel has no
bfloat16 (O2 with bf16 and a dynamic loss scale crashed on a GPU before this table), its CPU kernel
takes both half types. Grads are grouped by (device, dtype) and each group takes the route the table
gives; a device type the table does not know tries the fused op and falls back on refusal.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Tuple

import torch

from apexlite._logging import get_logger

FoundInf = Dict[torch.device, torch.Tensor]
FUSED, FOREACH = "fused", "foreach"
FUSED_DTYPES: Dict[str, Tuple[torch.dtype, ...]] = {
    "cuda": (torch.float16, torch.float32, torch.float64),
    "cpu": (torch.float16, torch.bfloat16, torch.float32, torch.float64),
}

log = get_logger("amp")


def route_for(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    """FUSED or FOREACH for a (device, dtype) group; None where the table does not know the device."""
    known = FUSED_DTYPES.get(device.type)
    if known is None:
        return None
    return FUSED if dtype in known else FOREACH


def unscale_foreach(grads: List[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    """The foreach route: flag non-finite grads into `found_inf`, then multiply by the 0-dim scale."""
    norms = torch._foreach_norm(grads, float("inf"))
    nonfinite = torch.logical_not(torch.isfinite(torch.stack(norms))).any()
    found_inf.copy_(torch.maximum(found_inf, nonfinite.to(found_inf.dtype)))
    torch._foreach_mul_(grads, inv_scale.reshape(()))


def _unscale_group(group: List[torch.Tensor], flag: torch.Tensor, inv: torch.Tensor, route: Optional[str]) -> None:
    if route == FOREACH:
        unscale_foreach(group, flag, inv)
        return
    try:
        torch._amp_foreach_non_finite_check_and_unscale_(group, flag, inv)
    except (RuntimeError, NotImplementedError) as refusal:
        if route == FUSED:
            raise
        log.debug("torch's fused unscale refused %s grads on %s (%s); using the foreach route",
                  group[0].dtype, group[0].device, refusal)
        unscale_foreach(group, flag, inv)


def unscale_and_check(grads: Iterable[torch.Tensor], inv_scale: float, found_inf: FoundInf,
                      force_route: Optional[str] = None) -> None:
    """Multiply `grads` in place by `inv_scale` and flag non-finite values per device (no host sync).

    `found_inf` maps a device to its float32 one-element flag, created zeroed when missing.
    `force_route` (FUSED or FOREACH) overrides the table, for tests.
    """
    groups: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = defaultdict(list)
    for grad in grads:
        # a sparse grad (Embedding(sparse=True)) through its values, as torch's GradScaler reads it: each is a
        # product with the scale, so unscaling the uncoalesced entries unscales their sums
        groups[(grad.device, grad.dtype)].append(grad._values() if grad.is_sparse else grad)
    inverses: Dict[torch.device, torch.Tensor] = {}
    for (device, dtype), group in groups.items():
        flag = found_inf.get(device)
        if flag is None:
            flag = found_inf[device] = torch.zeros(1, dtype=torch.float32, device=device)
        inv = inverses.get(device)
        if inv is None:
            inv = inverses[device] = torch.full((1,), inv_scale, dtype=torch.float32, device=device)
        _unscale_group(group, flag, inv, force_route or route_for(device, dtype))
