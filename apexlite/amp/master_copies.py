"""What both O2 grad strategies (master.py, fused_master.py) do with fp32 masters as tensors: which dtypes get
one, copying them into the model all or nothing, and checking a checkpoint's masters before loading them."""
from __future__ import annotations

from typing import Any, List

import torch

from apexlite.amp.checkpoint_convert import MASTERS_KEY
from apexlite.amp.errors import AmpUsageError
from apexlite.amp.master_sync import rebuild_changed_masters

LOW_PRECISION = (torch.float16, torch.bfloat16)


def copy_into(targets: List[torch.Tensor], sources: List[torch.Tensor]) -> None:
    """Copy each source into its target. If the batched copy raises, every target is still copied
    (one by one) before the error propagates: a model is never left part on one step, part on another."""
    if not targets:
        return
    with torch.no_grad():
        try:
            torch._foreach_copy_(targets, sources)
        except BaseException:
            for target, source in zip(targets, sources):
                target.copy_(source)
            raise


def check_saved_masters(saved: Any, targets: List[torch.Tensor]) -> None:
    """Checkpointed fp32 masters must match the live ones in count and shapes (checked before loading)."""
    if not isinstance(saved, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in saved):
        raise AmpUsageError(f"optimizer checkpoint entry {MASTERS_KEY!r} must be a list of tensors; "
                            f"got {type(saved).__name__}.")
    if len(saved) != len(targets):
        raise AmpUsageError(
            f"optimizer checkpoint holds {len(saved)} fp32 master weights but this O2 optimizer has "
            f"{len(targets)}: it was saved from a different model or param-group layout."
        )
    for index, (tensor, target) in enumerate(zip(saved, targets)):
        if tensor.shape != target.shape:
            raise AmpUsageError(
                f"optimizer checkpoint master {index} has shape {tuple(tensor.shape)} but this O2 optimizer's "
                f"has {tuple(target.shape)}: it was saved from a different model."
            )


def keep_loaded_weights(params: List[torch.Tensor], masters: List[torch.Tensor], written: List[bool]) -> int:
    """After an optimizer checkpoint set `masters`: where a param was written before that load (`written`, MasterSync.written) and
    the loaded master does not round to it, the model's checkpoint and the optimizer's come from different
    steps (a run continued without amp kept the old masters): the loaded model weights win, as apex built
    its masters from them; returns how many masters were rebuilt so."""
    return rebuild_changed_masters([(param, master) for param, master, fresh in zip(params, masters, written)
                                    if fresh])


def stale_masters_note(rebuilt: int, total: int, label: str) -> str:
    """The warning when loaded masters were set aside for the model's weights (`keep_loaded_weights`, and the
    loads before initialize)."""
    return (f"{label}: the optimizer checkpoint's fp32 masters of {rebuilt} of {total} params do not round to the "
            "model's weights, which every apexlite O2 checkpoint's do: the model's weights come from another step "
            "(a run without amp kept the old masters) or were not loaded. Those masters were rebuilt from the "
            "model's weights, as apex built them; load the model's weights from the optimizer's checkpoint to "
            "resume from it")


def o2_accumulation_note(label: str) -> str:
    """The warning for O2 gradient accumulation across ranks (said once per optimizer)."""
    return (f"amp O2 ({label}), across ranks: a backward adds to grads of earlier micro-batches, which are summed "
            "in fp32 on the masters. If those micro-batches ran under DDP's no_sync() (or apex DDP's "
            "disable_allreduce()), their grads were never all-reduced and the ranks drift apart: pass "
            "delay_unscale=True to their scale_loss blocks, which keeps their grads on the model where DDP reduces "
            "them (summed in fp16/bf16 then). Micro-batches that each all-reduce are summed exactly (said once)")
