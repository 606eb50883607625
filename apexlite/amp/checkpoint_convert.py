"""Loading an O2 optimizer checkpoint (fp32 masters inside) into a run without master weights.

An O2 checkpoint carries the fp32 masters, either as a list under MASTERS_KEY (separate masters:
the low-precision params in param-group order) or as `master_param` in each half param's state
(optimizers that keep their own masters, e.g. FusedAdam). Where the live optimizer has no masters
(O0/O1/O3), the masters are the best values the params can get, so they are copied into the params.
When the list cannot be matched to the params without guessing, loading fails and says why.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from apexlite.amp.errors import AmpUsageError

MASTERS_KEY = "apexlite_master_params"


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

