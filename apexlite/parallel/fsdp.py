"""apexlite loss scaling with FSDP2 (`torch.distributed.fsdp.fully_shard` + `MixedPrecisionPolicy`).

Division of labour: FSDP owns the precision of parameters (its sharded params stay fp32, which makes
them the master weights at 1/world of the memory; `MixedPrecisionPolicy(param_dtype=...)` casts the
all-gathered copy for compute; `reduce_dtype` sets the reduce-scatter dtype). apexlite owns loss
scaling: `scale_loss` unscales and checks each rank's gradient SHARD, and the found-inf flag is
all-reduced (NOTE [overflow agreement]) so every rank skips together, as ShardedGradScaler does.

Opt levels: O0 (with dynamic loss scaling; FSDP does the casting) and O1 (apexlite's op-level
casts on the fp32 compute params) make sense. O2 and O3 are refused: they cast the model and keep
full fp32 master copies outside FSDP, which would either duplicate FSDP's sharded fp32 params or,
with the model cast before sharding, shard fp16 params with no fp32 master at all.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from apexlite.amp.errors import AmpConfigError
from apexlite.parallel.overflow import sync_overflow

FSDP_OPT_LEVELS = ("O0", "O1")

_REFUSAL = (
    "opt_level={level!r} is not supported with FSDP: {why} Use opt_level='O0' (FSDP's "
    "MixedPrecisionPolicy(param_dtype=torch.float16) does the casting, apexlite the dynamic loss "
    "scaling) or 'O1'; FSDP's sharded fp32 params already are the master weights."
)


def check_fsdp_opt_level(opt_level: str) -> None:
    """Raise AmpConfigError for opt levels that would be silently wrong under FSDP."""
    if opt_level in FSDP_OPT_LEVELS:
        return
    if opt_level in ("O2", "O3"):
        why = ("it casts the model to fp16/bf16" + (" and keeps unsharded fp32 master copies"
                                                    if opt_level == "O2" else "") + ".")
        raise AmpConfigError(_REFUSAL.format(level=opt_level, why=why))
    raise AmpConfigError(f"unknown opt_level {opt_level!r}; FSDP supports {', '.join(FSDP_OPT_LEVELS)}.")


def fsdp2() -> Any:
    """The module holding FSDP2's `fully_shard` and `MixedPrecisionPolicy`: torch.distributed.fsdp from
    torch 2.6, torch.distributed._composable.fsdp in torch 2.5 (the floor)."""
    import torch.distributed.fsdp as public

    if hasattr(public, "fully_shard"):
        return public
    import torch.distributed._composable.fsdp as composable

    return composable


def fully_shard(module: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
    """torch's FSDP2 `fully_shard`, refusing a model whose params were already cast to fp16/bf16.

    A model cast by O2/O3 (or by hand) would be sharded in low precision with no fp32 master; pass
    the fp32 model and `mp_policy=MixedPrecisionPolicy(param_dtype=...)` instead.
    """
    torch_fully_shard = fsdp2().fully_shard

    low = [name for name, p in module.named_parameters() if p.dtype in (torch.float16, torch.bfloat16)]
    if low:
        raise AmpConfigError(
            f"fully_shard got low-precision parameters ({', '.join(low[:3])}{', ...' if len(low) > 3 else ''}): "
            "shard the fp32 model and set mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16); do "
            "not apply amp O2/O3 (or .half()) before FSDP.")
    return torch_fully_shard(module, **kwargs)


def initialize_fsdp(model: torch.nn.Module, optimizers: Any, opt_level: str = "O0", *,
                    loss_scale: Any = "dynamic", process_group: Optional[Any] = None, **amp_kwargs: Any) -> Any:
    """`amp.initialize` for a model already sharded with `fully_shard`, with cross-rank overflow checks.

    Args:
        model: the FSDP2 module (after `fully_shard`); optimizers built on its (sharded) parameters.
        opt_level: "O0" (default; the model is left to FSDP, no apexlite input/output casts) or
            "O1"; "O2"/"O3" raise AmpConfigError (see module docstring).
        loss_scale: "dynamic" by default, also for O0 (FSDP's fp16 compute needs it).
        process_group: the ranks that must agree on overflow (default: the world).
        amp_kwargs: any other `amp.initialize` argument.
    Returns what `amp.initialize` returns.
    """
    FSDPModule = fsdp2().FSDPModule

    from apexlite.amp.frontend import initialize

    check_fsdp_opt_level(opt_level)
    if not isinstance(model, FSDPModule):
        raise AmpConfigError("initialize_fsdp expects a model sharded with fully_shard(model, ...) first; "
                             f"got {type(model).__name__}.")
    if opt_level == "O0":
        # FSDP casts inputs and params for compute; an O0 fp32 input cast would undo that
        amp_kwargs.setdefault("cast_model_type", False)
    result = initialize(model, optimizers, opt_level=opt_level, loss_scale=loss_scale, **amp_kwargs)
    sync_overflow(process_group)
    return result
