"""FusedAdam's checkpoints: what its ``state_dict()`` adds to torch's format, and what ``load_state_dict`` checks
before torch loads a torch, apex or apexlite checkpoint and settles after it (state dtypes, masters, modes)."""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from apexlite._logging import get_logger
from apexlite.optimizers import _adam_state as adam_state
from apexlite.optimizers._group_steps import load_group_count, save_group_count

_log = get_logger("optimizers")


def pack(packed: Dict[str, Any], optimizer: torch.optim.Optimizer, steps_itself: bool) -> Dict[str, Any]:
    """torch's state_dict with plain dicts (the live state watches its entries, _watched_state.py); each group
    also names its mode in torch's key, so torch.optim.Adam loading it trains in the same mode. ``steps_itself``:
    FusedAdam's own step() keeps apex's per-group count, which the groups then carry."""
    packed["state"] = {key: dict(entry) for key, entry in packed["state"].items()}
    for group, live in zip(packed["param_groups"], optimizer.param_groups):
        group["decoupled_weight_decay"] = bool(group["adam_w_mode"])
        if steps_itself:
            save_group_count(group, live, optimizer.state)
    return packed


def check_loadable(optimizer: torch.optim.Optimizer, state_dict: Dict[str, Any]) -> Dict[Any, torch.Tensor]:
    """Refuses what FusedAdam cannot train from (AMSGrad, maximize, shapes unlike the params'); returns the
    checkpoint's param ids mapped to the optimizer's params."""
    if any(group.get("amsgrad") for group in state_dict["param_groups"]):
        raise RuntimeError("this checkpoint comes from an AMSGrad optimizer; FusedAdam does not implement "
                           "AMSGrad, load it into torch.optim.Adam(amsgrad=True) instead.")
    adam_state.refuse_maximize(state_dict["param_groups"], "this checkpoint")
    ids = [pid for group in state_dict["param_groups"] for pid in group["params"]]
    by_id = dict(zip(ids, (p for group in optimizer.param_groups for p in group["params"])))
    adam_state.check_checkpoint_shapes(state_dict["state"], by_id)
    return by_id


def settle_loaded(optimizer: torch.optim.Optimizer, state_dict: Dict[str, Any], by_id: Dict[Any, torch.Tensor],
                  built_modes: List[Any], steps_itself: bool) -> None:
    """After torch's load: FusedAdam's state dtypes and devices, masters handed to fp32 params, each group's
    weight-decay mode and keys, and (``steps_itself``: see :func:`pack`) apex's group step count."""
    adam_state.settle_weight_decay_modes(optimizer.param_groups, built_modes)
    if len({group["adam_w_mode"] for group in optimizer.param_groups}) == 1:
        optimizer.adam_w_mode = int(optimizer.param_groups[0]["adam_w_mode"])
    handed = []
    for pid, saved in state_dict["state"].items():
        param = by_id.get(pid)
        if param is None:
            continue
        for key, value in saved.items():
            if torch.is_tensor(value):
                optimizer.state[param][key] = adam_state.restore_value(key, value, param, optimizer.exp_avg_dtype)
        handed.append(adam_state.hand_master_to_fp32_param(param, optimizer.state[param]))
        adam_state.prepare_state(param, optimizer.state[param])
    handed_over, stale = handed.count("taken"), handed.count("stale")
    if stale:
        _log.warning("FusedAdam.load_state_dict: %d fp32 master weight(s) in the checkpoint are not their params' "
                     "values nor their fp16/bf16 rounding, which every apexlite O2 checkpoint's are: the params come "
                     "from another step (a run without amp kept the old masters) or were not loaded. Those params "
                     "keep their values; load the model's weights from the optimizer's checkpoint to resume from it",
                     stale)
    if handed_over:
        _log.info("FusedAdam.load_state_dict: the checkpoint holds fp32 master weights (amp O2 or "
                  "master_weights=True) for %d float32 params (amp O0/O1); each param took its master's "
                  "values and keeps no separate master", handed_over)
    for group in optimizer.param_groups:
        for key, default in optimizer.defaults.items():  # torch checkpoints lack FusedAdam's own keys
            group.setdefault(key, default)
        if steps_itself:  # a subclass with its own step() (e.g. fairseq's) reads apex's group["step"]
            load_group_count(group, optimizer.state)
