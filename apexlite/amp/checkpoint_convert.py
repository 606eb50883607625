"""Loading an O2 optimizer checkpoint (fp32 masters inside) into a run without master weights.

An O2 checkpoint carries the fp32 masters, either as a list under MASTERS_KEY (separate masters:
the low-precision params in param-group order) or as `master_param` in each half param's state
(optimizers that keep their own masters, e.g. FusedAdam). Where the live optimizer has no masters
(O0/O1/O3), the masters are the best values the params can get, so they are copied into the params.
When the list cannot be matched to the params without guessing, loading fails and says why.

NOTE [masters carried through a load before initialize]
torch's `Optimizer.load_state_dict` keeps only `state` and `param_groups`, so the MASTERS_KEY list of an O2
checkpoint loaded before `amp.initialize` would be dropped without a word and the run would resume from the
low-precision model weights. Each param group of such a checkpoint therefore also carries its own masters,
in group order, under MASTERS_MARKER (the same tensors as in MASTERS_KEY, so a saved file holds them once):
torch keeps that entry in the live groups, and `initialize` takes the masters from it (checked first against
the group's params in count and shapes; refused, naming the right order, when they do not fit or an entry
holds no masters). apexlite's own loads strip the entry. Masters kept in per-param state (`master_param`,
FusedAdam's format) survive torch's load and are restored at initialize too.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from apexlite.amp.errors import AmpUsageError

MASTERS_KEY = "apexlite_master_params"
MASTERS_MARKER = "apexlite_o2_masters"  # param-group key: that group's fp32 masters (NOTE above)


def mark_masters(state: Dict[str, Any], masters_by_group: List[List[torch.Tensor]]) -> None:
    """Give each param group of an optimizer checkpoint its own masters, in group order (NOTE above)."""
    state["param_groups"] = [dict(group, **{MASTERS_MARKER: list(masters)})
                             for group, masters in zip(state["param_groups"], masters_by_group)]


def without_marker(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """`state_dict` (a shallow copy) whose param groups lack MASTERS_MARKER, for loading into a live optimizer."""
    groups = state_dict.get("param_groups")
    if not isinstance(groups, list) or not any(isinstance(g, dict) and MASTERS_MARKER in g for g in groups):
        return dict(state_dict)
    return dict(state_dict, param_groups=[{k: v for k, v in g.items() if k != MASTERS_MARKER} if isinstance(g, dict)
                                          else g for g in groups])


def _refuse_carried(optimizer: Any, why: str) -> AmpUsageError:
    return AmpUsageError(
        f"{type(optimizer).__name__} was given an apexlite O2 checkpoint (optimizer.load_state_dict) before "
        f"amp.initialize, and {why}. Call amp.initialize(model, optimizer, ...) first, then "
        "optimizer.load_state_dict(checkpoint). To resume from the model weights alone instead, remove the entry: "
        f"`for g in optimizer.param_groups: g.pop({MASTERS_MARKER!r}, None)`."
    )


def _carried_pairs(optimizer: Any, models: List[torch.nn.Module]) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """(param, fp32 master) for the masters each live param group carries; raises when they do not fit."""
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for index, group in enumerate(getattr(optimizer, "param_groups", ())):
        if not isinstance(group, dict) or MASTERS_MARKER not in group:
            continue
        carried = group[MASTERS_MARKER]
        if not isinstance(carried, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in carried):
            raise _refuse_carried(optimizer, f"param group {index}'s {MASTERS_MARKER!r} entry holds no fp32 "
                                             "master weights (a checkpoint of an older apexlite)")
        targets = match_masters(list(carried), list(group["params"]), models)
        if targets is None:
            raise _refuse_carried(optimizer, f"the {len(carried)} fp32 master weights param group {index} carries "
                                             "do not match its params in count and shapes")
        pairs.extend(zip(targets, carried))
    return pairs


def check_carried_masters(optimizers: List[Any], models: List[torch.nn.Module]) -> None:
    """Validation only: the masters that optimizers loaded before initialize fit their params."""
    for optimizer in optimizers:
        _carried_pairs(optimizer, models)


def take_carried_masters(optimizer: Any, models: List[torch.nn.Module]) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Pop the masters a load before initialize left in the live param groups, paired with their params."""
    pairs = _carried_pairs(optimizer, models)
    for group in optimizer.param_groups:
        group.pop(MASTERS_MARKER, None)
    return [(param, master.detach().to(device=param.device, dtype=torch.float32)) for param, master in pairs]
def _affine_batchnorm_params(models: List[torch.nn.Module]) -> set:
    return {id(p) for model in models for module in model.modules()
            if isinstance(module, _BatchNorm) and module.affine for p in module.parameters(recurse=False)}


def match_masters(saved: List[torch.Tensor], params: List[torch.Tensor],
                  models: List[torch.nn.Module]) -> Optional[List[torch.Tensor]]:
    """The params the saved masters belong to: every trainable param, or every one but batchnorm's
    (O2 keeps affine batchnorm fp32 by default); None when neither layout fits in count and shapes."""
    trainable = [p for p in params if p.requires_grad]
    batchnorm = _affine_batchnorm_params(models)
    for candidate in (trainable, [p for p in trainable if id(p) not in batchnorm]):
        if len(candidate) == len(saved) and all(p.shape == t.shape for p, t in zip(candidate, saved)):
            return candidate
    return None


def take_masters_for_params(state_dict: Dict[str, Any], params: List[torch.Tensor],
                            models: List[torch.nn.Module]) -> List[Any]:
    """Pop MASTERS_KEY from `state_dict` (a copy) and pair the masters with params; validates only."""
    saved = state_dict.pop(MASTERS_KEY, None)
    if saved is None:
        return []
    targets = match_masters(list(saved), params, models) if isinstance(saved, (list, tuple)) else None
    if targets is None:
        raise AmpUsageError(
            f"this optimizer checkpoint was saved under O2 and carries {len(saved) if hasattr(saved, '__len__') else '?'} "
            "fp32 master weights, but this run has no master weights (O0/O1/O3) and they do not match "
            "this optimizer's params in count and shapes. Load it with opt_level='O2' on the same model, "
            f"or remove the {MASTERS_KEY!r} entry to keep only the optimizer state."
        )
    return list(zip(targets, saved))


def copy_masters_into_params(pairs: List[Any], optimizer: Any) -> None:
    """Write saved masters (and any `master_param` left in per-param state) into the params."""
    with torch.no_grad():
        for param, master in pairs:
            param.copy_(master.to(param.device))
        for group in optimizer.param_groups:
            for param in group["params"]:
                state = optimizer.state.get(param)
                if state and "master_param" in state and not getattr(optimizer, "master_weights", False):
                    param.copy_(state.pop("master_param").to(param.device))



def take_owned_masters(state_dict: Dict[str, Any], params: List[torch.Tensor],
                       masters: List[torch.Tensor]) -> Optional[List[torch.Tensor]]:
    """`masters`' values from a checkpoint of an optimizer that kept them in its per-param state (FusedAdam's
    fused O2: `master_param`), taken out of `state_dict` (its state copied where changed) before the optimizer
    loads it; `params` are the live optimizer's, in param-group order. None when any master has none."""
    ids = [pid for group in state_dict.get("param_groups", []) for pid in group.get("params", [])]
    position = {id(param): index for index, param in enumerate(params)}
    saved_state = dict(state_dict.get("state", {}))
    owned = []
    for master in masters:
        index = position.get(id(master))
        pid = ids[index] if index is not None and index < len(ids) else None
        entry = saved_state.get(pid)
        if not isinstance(entry, dict) or "master_param" not in entry:
            return None
        entry = dict(entry)
        owned.append(entry.pop("master_param"))
        saved_state[pid] = entry
    if not owned:
        return None
    state_dict["state"] = saved_state
    return owned
