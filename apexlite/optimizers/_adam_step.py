"""The functional FusedAdam step: one call per (device, dtype) bucket, routed to a kernel or to torch.

Paths (``implementation``):

* ``"kernel"``: apexlite's compiled kernel for the bucket's device (``apexlite::fused_adam_``), or a
  ``RuntimeError`` that says how to build it;
* ``"torch"``: torch's own fused multi-tensor Adam ops (:mod:`apexlite.optimizers._torch_fused`),
  or a ``RuntimeError`` when this torch has none for the device;
* ``"reference"``: the pure-torch reference (:mod:`apexlite.optimizers._reference`), the test
  oracle: readable, per tensor, and synchronising with the device;
* ``"auto"`` (the default): the first of kernel, torch, reference that exists for the device. Only
  the last is slow, so only it warns (once per device type); the torch path logs once at INFO.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

from apexlite._native import loader as _ext
from apexlite._logging import get_logger
from apexlite.optimizers import _torch_fused
from apexlite.optimizers._reference import reference_adam_step

IMPLEMENTATIONS = ("auto", "kernel", "torch", "reference")
STEP_FUNCTIONS = {
    "kernel": lambda *args, **kwargs: torch.ops.apexlite.fused_adam_(*args, **kwargs),
    "torch": _torch_fused.torch_fused_adam_step,
    "reference": reference_adam_step,
}

_log = get_logger("optimizers")


@functools.lru_cache(maxsize=None)
def _note_torch_path(device_type: str) -> None:
    found = _ext.kernel_status(device_type)
    if _ext.status().source != "disabled" and not found.said:  # a failed build already said it, once
        _log.info("apexlite: FusedAdam on %s uses torch's fused Adam ops (no compiled apexlite kernel: %s)",
                  device_type, found.detail)


def resolve(implementation: str, device: torch.device) -> str:
    """The path ("kernel", "torch" or "reference") a bucket on ``device`` takes under ``implementation``."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "reference":
        return "reference"
    if implementation in ("auto", "kernel") and _ext.kernels_available(device.type):
        return "kernel"
    if implementation == "kernel":
        raise RuntimeError(
            f"FusedAdam(implementation='kernel'): no compiled kernel for {device.type} "
            f"({_ext.kernel_detail(device.type)}). To fix: {_ext.BUILD_HINT}; or pass implementation='auto'."
        )
    if _torch_fused.available(device.type):
        if implementation == "auto":
            _note_torch_path(device.type)
        return "torch"
    if implementation == "torch":
        raise RuntimeError(
            f"FusedAdam(implementation='torch'): torch {torch.__version__} has no fused Adam kernel for "
            f"{device.type} (torch._fused_adam_ runs on CPU from torch 2.4); use implementation='auto'."
        )
    _ext.warn_fallback(device.type)
    return "reference"


def bump_versions(tensors: Iterable[torch.Tensor]) -> None:
    """Marks tensors written through raw pointers as modified, so `_version`-keyed caches see it."""
    tensors = list(tensors)
    increment = getattr(torch.autograd.graph, "increment_version", None)
    if increment is not None:
        increment(tensors)
        return
    for tensor in tensors:
        torch._C._autograd._increment_version(tensor)


def uses_kernel(implementation: str, device: torch.device) -> bool:
    """Whether a bucket on ``device`` goes to apexlite's compiled kernel under ``implementation``."""
    return resolve(implementation, device) == "kernel"


def fused_adam_step(
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
    implementation: str = "auto",
    workspace: Optional[_torch_fused.Workspace] = None,
) -> str:
    """Runs one Adam/AdamW step over lists that share a device and, per list, a dtype.

    The arguments are those of the ``apexlite::fused_adam_`` op (documented in
    ``csrc/torch/ops.cpp`` and :func:`~apexlite.optimizers._reference.reference_adam_step`).
    ``workspace`` keeps the torch path's scratch memory between calls. Returns the path that ran:
    ``"kernel"``, ``"torch"`` or ``"reference"`` (``""`` for empty lists).
    """
    if not params:
        return ""
    path = resolve(implementation, params[0].device)
    extra = dict(workspace=workspace) if path == "torch" else {}
    STEP_FUNCTIONS[path](
        params, grads, exp_avgs, exp_avg_sqs, state_steps, model_copies,
        lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
        bias_correction=bias_correction, adam_w_mode=adam_w_mode,
        grad_scale=grad_scale, found_inf=found_inf, unscale_grads=unscale_grads, **extra,
    )
    return path


def fused_adam_flat_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    steps: torch.Tensor,
    model_copy: Optional[torch.Tensor],
    *,
    path: str,
    workspace: Optional[_torch_fused.Workspace] = None,
    **hyper,
) -> None:
    """One step over flat buffers (the ``apexlite::fused_adam_flat_`` contract, ``csrc/torch/ops.cpp``) on
    ``path``, "kernel" or "torch" (see :func:`resolve`); ``hyper`` holds fused_adam_step's keywords. The
    kernel is called through apexlite._C's direct op calls (1.5 us a call against torch.ops' 5.7)."""
    if path == "kernel":
        module = _ext.native_module()
        if module is None:  # (a CUDA kernel library without apexlite._C)
            torch.ops.apexlite.fused_adam_flat_(param, grad, exp_avg, exp_avg_sq, steps, model_copy, **hyper)
            return
        module.fused_adam_flat(param, grad, exp_avg, exp_avg_sq, steps, model_copy, *_positional(hyper))
        return
    if path != "torch":
        raise ValueError(f"flat buffers run on the kernel or torch path, not {path!r}")
    _torch_fused.torch_fused_adam_step(
        [param], [grad], [exp_avg], [exp_avg_sq], [steps[:1]], [] if model_copy is None else [model_copy],
        counters=[steps], workspace=workspace, **hyper)


def fused_adam_flat_grad_list_step(param: torch.Tensor, grads: Any, offsets: torch.Tensor,
                                   exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, steps: torch.Tensor,
                                   model_copy: Optional[torch.Tensor], **hyper) -> None:
    """One step over flat buffers with each member's grad read where it is (the
    ``apexlite::fused_adam_flat_grad_list_`` contract, ``csrc/torch/ops.cpp``): apexlite's kernels only.
    ``grads``: a tuple of tensors, or the C++ grad check's apexlite._C.GradList."""
    module = _ext.native_module()
    if module is None:  # (a CUDA kernel library without apexlite._C)
        torch.ops.apexlite.fused_adam_flat_grad_list_(param, grads, offsets, exp_avg, exp_avg_sq, steps, model_copy,
                                                      **hyper)
        return
    module.fused_adam_flat_grad_list(param, grads, offsets, exp_avg, exp_avg_sq, steps, model_copy, *_positional(hyper))


def _positional(hyper: Dict[str, Any]) -> Tuple[Any, ...]:
    """fused_adam_step's keywords in the order of apexlite._C's direct op calls (csrc/torch/op_calls.cpp)."""
    return (hyper["lr"], hyper["beta1"], hyper["beta2"], hyper["eps"], hyper["weight_decay"], hyper["bias_correction"],
            hyper["adam_w_mode"], hyper.get("grad_scale"), hyper.get("found_inf"), hyper.get("unscale_grads", False))


def flag_on(value: Union[None, float, torch.Tensor], device: torch.device) -> Optional[torch.Tensor]:
    """A GradScaler-style flag (scale or found_inf) as a float32 tensor on ``device``, or None.

    A Python number becomes a device tensor by a fill, with no host-to-device copy.
    """
    if value is None:
        return None
    if torch.is_tensor(value):
        return value.to(device=device, dtype=torch.float32, non_blocking=True)
    return torch.full((1,), float(value), dtype=torch.float32, device=device)
