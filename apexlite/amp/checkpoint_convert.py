"""Loading an O2 optimizer checkpoint (fp32 masters inside) into a run without master weights.

An O2 checkpoint carries the fp32 masters, either as a list under MASTERS_KEY (separate masters:
the low-precision params in param-group order) or as `master_param` in each half param's state
(optimizers that keep their own masters, e.g. FusedAdam). Where the live optimizer has no masters
(O0/O1/O3), the masters are the best values the params can get, so they are copied into the params.
When the list cannot be matched to the params without guessing, loading fails and says why.

NOTE [masters dropped by a load before initialize]
torch's `Optimizer.load_state_dict` keeps only `state` and `param_groups`, so an O2 checkpoint of a
torch optimizer loaded before `amp.initialize` loses its masters without a word, and the run would
resume from the low-precision model weights. Each param group of such a checkpoint therefore carries
MASTERS_MARKER (a bool, which torch keeps in the live groups): `initialize` refuses an optimizer that
holds it, naming the right order. apexlite's own loads strip it. Masters kept in per-param state
(`master_param`, FusedAdam's format) survive torch's load and are restored at initialize.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from apexlite.amp.errors import AmpUsageError

MASTERS_KEY = "apexlite_master_params"
MASTERS_MARKER = "apexlite_o2_masters"  # param-group key: the checkpoint carried fp32 masters under MASTERS_KEY


def mark_masters(state: Dict[str, Any]) -> None:
    """Tag each param group of an optimizer checkpoint that carries masters (NOTE above)."""
    state["param_groups"] = [dict(group, **{MASTERS_MARKER: True}) for group in state["param_groups"]]


def without_marker(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """`state_dict` (a shallow copy) whose param groups lack MASTERS_MARKER, for loading into a live optimizer."""
    groups = state_dict.get("param_groups")
    if not isinstance(groups, list) or not any(isinstance(g, dict) and MASTERS_MARKER in g for g in groups):
        return dict(state_dict)
    return dict(state_dict, param_groups=[{k: v for k, v in g.items() if k != MASTERS_MARKER} if isinstance(g, dict)
                                          else g for g in groups])


def check_masters_not_dropped(optimizers: List[Any]) -> None:
    """Refuse optimizers that loaded an O2 checkpoint before initialize (its masters are gone)."""
    for optimizer in optimizers:
        if any(isinstance(g, dict) and g.get(MASTERS_MARKER) for g in getattr(optimizer, "param_groups", ())):
            raise AmpUsageError(
                f"{type(optimizer).__name__} was given an apexlite O2 checkpoint (optimizer.load_state_dict) before "
                "amp.initialize: torch's load_state_dict keeps no fp32 master weights, so the run would resume "
                "from the half-precision model weights and differ from the original. Call amp.initialize(model, "
                "optimizer, ...) first, then optimizer.load_state_dict(checkpoint). To resume from the model "
                f"weights alone instead, remove the marker: `for g in optimizer.param_groups: g.pop({MASTERS_MARKER!r}, None)`."
            )


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

