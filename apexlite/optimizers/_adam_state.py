"""Per-parameter FusedAdam state: creation, layout matching, checkpoint restore (the weight-decay mode included), bucketing.

State keys follow torch.optim.Adam so checkpoints move between torch, apex and apexlite:
``step`` (float32 scalar tensor on the param's device), ``exp_avg``, ``exp_avg_sq``, plus
``master_param`` (the fp32 master of an fp16/bf16 param when master weights are on).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.master_rounding import holds_master

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HALF_DTYPES = (torch.float16, torch.bfloat16)
MOMENT_KEYS = ("exp_avg", "exp_avg_sq")
_log = get_logger("optimizers")


@dataclass
class Bucket:
    """Parallel lists for one fused call: every tensor on one device, every list of one dtype."""

    device: torch.device
    dense: bool
    grads_unscaled: bool = False  # the grads are masters' own fp32 grads: grad_scale does not apply
    params: List[torch.Tensor] = field(default_factory=list)
    grads: List[torch.Tensor] = field(default_factory=list)
    exp_avgs: List[torch.Tensor] = field(default_factory=list)
    exp_avg_sqs: List[torch.Tensor] = field(default_factory=list)
    state_steps: List[torch.Tensor] = field(default_factory=list)
    model_copies: List[torch.Tensor] = field(default_factory=list)
    written: List[torch.Tensor] = field(default_factory=list)  # model params whose version must bump
    # (param, grad) for every grad laid out unlike its param: the only ones that may share memory
    unlike_params: List[Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    # of those, the grads the kernels read through a laid-out copy in ``grads`` (and unscale into):
    # GradScaler's contract wants the unscaled values in the originals
    odd_grads: List[torch.Tensor] = field(default_factory=list)
    odd_grad_copies: List[torch.Tensor] = field(default_factory=list)


def check_dtype(tensor: torch.Tensor, what: str) -> None:
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"FusedAdam supports float32, float16 and bfloat16 {what}s; got a {tensor.dtype} {what} of "
            f"shape {tuple(tensor.shape)}. Cast the model (e.g. model.float()) or use torch.optim.Adam."
        )


def is_dense(tensor: torch.Tensor) -> bool:
    """True when the elements fill one gap-free block of memory in some dim order (what the kernel walks)."""
    if tensor.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted(zip(tensor.shape, tensor.stride()), key=lambda dim: dim[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def fp32_copy(source: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A float32 copy of ``source`` with the memory layout of ``like`` (a master weight)."""
    return torch.empty_like(like, dtype=torch.float32).copy_(source.detach())


def with_layout(tensor: torch.Tensor, like: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``tensor`` itself when it already has ``like``'s strides (and ``dtype``), else a matching copy."""
    dtype = dtype or tensor.dtype
    if tensor.dtype == dtype and tensor.stride() == like.stride() and tensor.device == like.device:
        return tensor
    return torch.empty_like(like, dtype=dtype).copy_(tensor)


def grad_in_layout(grad: torch.Tensor, like: torch.Tensor) -> Tuple[torch.Tensor, bool]:
    """``grad`` with the strides of ``like`` (the dense tensor the kernel pairs it with), and whether
    that is a copy (whose values do not reach ``grad`` unless copied back) rather than ``grad``'s memory.

    Strides that differ only on dims of size 1 address the same memory (e.g. the grad of a conv weight
    with one input channel, fed channels_last input), so the grad is then restrided as a view and the
    kernel reads and writes ``.grad``'s own memory. Otherwise the result is a copy in ``like``'s layout.
    """
    if grad.stride() == like.stride():
        return grad, False
    if all(g == w for size, g, w in zip(grad.shape, grad.stride(), like.stride()) if size > 1):
        return grad.as_strided(like.shape, like.stride(), grad.storage_offset()), False
    return torch.empty_like(like, dtype=grad.dtype).copy_(grad), True


def init_state(param: torch.Tensor, state: dict, master_weights: bool, moment_dtype: torch.dtype) -> None:
    """Fills the missing entries of one param's state (lazily, at its first step)."""
    if master_weights and param.dtype in HALF_DTYPES and "master_param" not in state:
        state["master_param"] = fp32_copy(param, param)
    target = state.get("master_param", param)
    if "step" not in state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
    for key in MOMENT_KEYS:
        if key not in state:
            state[key] = torch.zeros_like(target, dtype=moment_dtype, memory_format=torch.preserve_format)


def prepare_state(param: torch.Tensor, state: dict) -> None:
    """Puts state that came from outside (a checkpoint, a later master) where the kernel wants it.

    Called after loading or replacing state rather than every step: afterwards ``step`` is a float32
    scalar on the param's device and masters and moments share the param's memory layout.
    """
    if "step" in state:
        step = state["step"]
        state["step"] = torch.as_tensor(step, dtype=torch.float32).to(param.device).reshape(()).clone()
    if not is_dense(param):  # served by the pure-torch path, any layout works
        return
    if "master_param" in state:
        state["master_param"] = with_layout(state["master_param"], param, torch.float32)
    target = state.get("master_param", param)
    for key in MOMENT_KEYS:
        if key in state:
            state[key] = with_layout(state[key], target)


def restore_value(key: str, value: torch.Tensor, param: torch.Tensor, moment_dtype: torch.dtype) -> torch.Tensor:
    """A private copy of one checkpointed state tensor, with the dtype FusedAdam keeps for ``key``."""
    dtype = {"step": torch.float32, "master_param": torch.float32}.get(key)
    if key in MOMENT_KEYS:
        dtype = moment_dtype
    return value.detach().to(device=param.device, dtype=dtype or value.dtype, copy=True)


def check_checkpoint_shapes(saved_state: Dict, params_by_id: Dict) -> None:
    """Rejects, before anything is loaded, a checkpointed master or moment whose shape is not its param's
    (copying it into place would broadcast it without an error)."""
    for pid, saved in saved_state.items():
        param = params_by_id.get(pid)
        if param is None or not isinstance(saved, dict):
            continue
        for key, value in saved.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != param.shape:
                what = "master weight" if key == "master_param" else key
                raise ValueError(
                    f"checkpoint state {pid} holds a {what} of shape {tuple(value.shape)} for a param of "
                    f"shape {tuple(param.shape)}: the checkpoint comes from another model or param-group layout."
                )


def hand_master_to_fp32_param(param: torch.Tensor, state: dict) -> str:
    """A master for a float32 param (an O2 checkpoint in an O0/O1 run, or loaded before amp.initialize): the
    param takes its values ("taken"), unless the param does not hold that master nor its fp16/bf16 rounding:
    then the master is from an older step than the loaded weights (a run without amp kept it) and the param
    keeps its value ("stale"). Either way the master goes: a float32 param is its own master, and a second one
    would make the step write a float32 "copy" the kernels do not accept. "" when there is none."""
    master = state.get("master_param")
    if master is None or param.dtype != torch.float32:
        return ""
    taken = holds_master(param, master)
    if taken:
        with torch.no_grad():
            param.copy_(master)
    del state["master_param"]
    return "taken" if taken else "stale"


def step_grad(param: torch.Tensor, state: Optional[dict]) -> Tuple[Optional[torch.Tensor], bool]:
    """The gradient a step uses for ``param``, and whether it is a master's own (unscaled) fp32 grad.

    A master weight's ``.grad``, when set, wins over the param's: apexlite's amp puts unscaled fp32
    grads there under O2 when the user clips them or accumulates over several backward passes.
    """
    master = state.get("master_param") if state else None
    if master is not None and master.grad is not None:
        return master.grad, True
    return param.grad, False


def add_to_bucket(buckets: Dict[Tuple, Bucket], param: torch.Tensor, grad: torch.Tensor, state: dict,
                  grads_unscaled: bool = False) -> None:
    """Files one param (with a grad and initialised state) into its (device, dtypes) bucket."""
    target = state.get("master_param", param)
    # the fused paths walk the master and its model copy as one block each, in the same order
    dense = is_dense(target) and (target is param or target.stride() == param.stride())
    copy_dtype = param.dtype if target is not param else None
    key = (param.device, target.dtype, grad.dtype, copy_dtype, state["exp_avg"].dtype, dense, grads_unscaled)
    bucket = buckets.get(key)
    if bucket is None:
        bucket = buckets[key] = Bucket(device=param.device, dense=dense, grads_unscaled=grads_unscaled)
    bucket.params.append(target)
    laid_out, copied = grad_in_layout(grad, target) if dense else (grad, False)
    if laid_out is not grad or (not dense and grad.stride() != target.stride()):
        bucket.unlike_params.append((param, grad))
    if copied:
        bucket.odd_grads.append(grad)
        bucket.odd_grad_copies.append(laid_out)
    bucket.grads.append(laid_out)
    bucket.exp_avgs.append(state["exp_avg"])
    bucket.exp_avg_sqs.append(state["exp_avg_sq"])
    bucket.state_steps.append(state["step"])
    if target is not param:
        bucket.model_copies.append(param)
    bucket.written.append(param)


def _mode_name(adam_w_mode: bool) -> str:
    return "decoupled weight decay (AdamW)" if adam_w_mode else "L2 weight decay (Adam)"


def settle_weight_decay_modes(groups: List[Dict[str, Any]], built_modes: List[bool]) -> None:
    """Each loaded group's weight-decay mode: the checkpoint's when it names one (``adam_w_mode``, or torch's
    ``decoupled_weight_decay``), as torch.optim.Adam, whose mode is a constructor flag too, takes every
    hyper-parameter of a loaded group; the constructor's otherwise. Warns once where they differ and
    weight decay is on (without it the modes update alike)."""
    differ = []
    for group, built in zip(groups, built_modes):
        torch_mode = group.pop("decoupled_weight_decay", None)  # adam_w_mode is the key the step reads
        saved = group.get("adam_w_mode", torch_mode)
        group["adam_w_mode"] = built if saved is None else bool(saved)
        if group["adam_w_mode"] != built and group["weight_decay"] != 0:
            differ.append(built)
    if differ:
        _log.warning("FusedAdam.load_state_dict: %d param group(s) of the checkpoint use %s, but this optimizer was "
                     "built with %s; the checkpoint's mode wins, as torch.optim.Adam takes a checkpoint's "
                     "decoupled_weight_decay. To train with the constructor's mode, set group['adam_w_mode'] after "
                     "loading.", len(differ), _mode_name(not differ[0]), _mode_name(differ[0]))


def refuse_maximize(groups: Iterable[Dict[str, Any]], where: str) -> None:
    """torch's `maximize=True` (gradient ascent) and `amsgrad=True`, which FusedAdam does not implement, set on
    a group: never ignored."""
    for group in groups:
        if group.get("maximize"):
            raise RuntimeError(f"{where} has maximize=True (torch's gradient ascent), which FusedAdam does not "
                               "implement; use torch.optim.Adam/AdamW(maximize=True), or negate the loss.")
        if group.get("amsgrad"):
            raise RuntimeError(f"{where} has amsgrad=True, which FusedAdam does not implement (it would train "
                               "plain Adam); use torch.optim.Adam/AdamW(amsgrad=True).")


def listed_once_across(groups: List[Dict[str, Any]]) -> None:
    """Every param of every group listed once (a group's list edited after it was added is checked here)."""
    seen: Dict[int, int] = {}
    for number, group in enumerate(groups):
        for param in group["params"]:
            if id(param) in seen:
                where = "twice in param group" if seen[id(param)] == number else \
                    f"in param groups {seen[id(param)]} and"
                raise ValueError(f"a param (shape {tuple(param.shape)}) is listed {where} {number}; FusedAdam "
                                 "would update it twice in one step. List each param once.")
            seen[id(param)] = number


def refuse_meta(params: Iterable[torch.Tensor]) -> None:
    for param in params:
        if isinstance(param, torch.Tensor) and param.is_meta:
            raise ValueError(f"a param of shape {tuple(param.shape)} is on the meta device (a shape without "
                             "values), which FusedAdam cannot step; materialise the model first "
                             "(model.to_empty(device=...) and load or initialise its weights).")


def fit_state(param: torch.Tensor, state: dict, moment_dtype: torch.dtype) -> None:
    """State a user replaced since the last step (a float64 moment, another memory layout, an int64 or
    shaped step) put back where the kernel wants it, values kept; a few reads when nothing changed."""
    step, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
    if step.dtype is torch.float32 and exp_avg.dtype is moment_dtype and exp_avg_sq.dtype is moment_dtype \
            and not step.dim() and "master_param" not in state:
        strides = param.stride()
        if exp_avg.stride() == strides and exp_avg_sq.stride() == strides and exp_avg.shape == param.shape:
            return
    target = state.get("master_param", param)
    for key in ("master_param", *MOMENT_KEYS):
        if key in state and state[key].shape != param.shape:
            raise RuntimeError(
                f"a param of shape {tuple(param.shape)} has its {key} of shape {tuple(state[key].shape)}: its .data "
                "was replaced by a tensor of another shape after its Adam state was made. To train the new shape "
                "from fresh moments, drop its state first (`del optimizer.state[param]`); or put back a tensor of "
                "the old shape.")
    if any(state[key].dtype != moment_dtype or state[key].device != target.device for key in MOMENT_KEYS):
        for key in MOMENT_KEYS:
            state[key] = state[key].to(device=target.device, dtype=moment_dtype)
    prepare_state(param, state)


def listed_once(params: List[Any]) -> List[Any]:
    """`params`, refused when one is listed twice: torch steps it twice and warns that this will be an error;
    a fused kernel would update it twice in one pass, racing with itself."""
    seen: Dict[int, int] = {}
    for index, param in enumerate(params):
        if id(param) in seen:
            raise ValueError(f"a param group lists one param twice (entries {seen[id(param)]} and {index}, shape "
                             f"{tuple(param.shape)}); FusedAdam's fused step would update it twice at once. List each "
                             "param once: model.parameters() lists a tied weight once.")
        seen[id(param)] = index
    return params


def add_masters(groups: List[Dict[str, Any]], state: Dict[torch.Tensor, dict],
                initial: Dict[torch.Tensor, torch.Tensor]) -> None:
    """Gives each fp16/bf16 param of ``groups`` an fp32 master, from ``initial[param]`` where given (checked
    against the groups' params and shapes before any master is made) or from the param."""
    known = {id(p) for group in groups for p in group["params"]}
    strangers = [tuple(t.shape) for t in initial if id(t) not in known]
    if strangers:
        raise ValueError(f"initial_masters has keys that are not params of this optimizer (shapes {strangers})")
    halves = [param for group in groups for param in group["params"] if param.dtype in HALF_DTYPES]
    for param in halves:
        source = initial.get(param, param)
        if source.shape != param.shape:
            raise ValueError(f"initial master of shape {tuple(source.shape)} for a param of shape "
                             f"{tuple(param.shape)}; pass the pre-cast tensor of the same param")
    for param in halves:
        state[param]["master_param"] = fp32_copy(initial.get(param, param), param)
        prepare_state(param, state[param])
