"""apex's master-weight lists on `optimizer._amp_stash`, which training scripts read under O2.

apex's lazy master init kept, per param group, the half model params (`fp16_groups`), their fp32
masters (`fp32_from_fp16_groups`) and the fp32 params stepped as they are (`fp32_from_fp32_groups`),
and the same flattened (`all_fp16_params`, `all_fp32_from_fp16_params`, `all_fp32_from_fp32_params`).
NVIDIA's BERT drops the masters' grads through `all_fp32_from_fp16_params` after a skipped step.
apexlite computes them from the grad strategy's pairs when read, so they follow the live groups. Without
master weights apex had none of them, and reading one raises AttributeError, as there.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

Groups = List[List[torch.Tensor]]


def _split_groups(optimizer: Any, pairs: List[Tuple[torch.Tensor, torch.Tensor]]) -> Tuple[Groups, Groups, Groups]:
    """(half model params, their masters, fp32 params) per param group, from (model, master) pairs; a group
    holds either the master (masters swapped into the groups) or the half param (masters kept in state)."""
    master_of: Dict[int, torch.Tensor] = {id(model): master for model, master in pairs}
    model_of: Dict[int, torch.Tensor] = {id(master): model for model, master in pairs}
    halves: Groups = []
    masters: Groups = []
    fp32: Groups = []
    for group in optimizer.param_groups:
        halves.append([])
        masters.append([])
        fp32.append([])
        for param in group["params"]:
            if id(param) in model_of:
                halves[-1].append(model_of[id(param)])
                masters[-1].append(param)
            elif id(param) in master_of:
                halves[-1].append(param)
                masters[-1].append(master_of[id(param)])
            else:
                fp32[-1].append(param)
    return halves, masters, fp32


class ApexStashLists:
    """The lists, as read-only attributes of the AmpOptimizer that is `optimizer._amp_stash`."""

    optimizer: Any
    grads: Any
    has_masters: bool

    def _groups(self, index: int, name: str) -> Groups:
        if not self.has_masters:
            raise AttributeError(f"optimizer._amp_stash has no {name}: apex kept it only with master weights (O2)")
        return _split_groups(self.optimizer, self.grads.master_pairs())[index]

    @property
    def fp16_groups(self) -> Groups:
        return self._groups(0, "fp16_groups")

    @property
    def fp32_from_fp16_groups(self) -> Groups:
        return self._groups(1, "fp32_from_fp16_groups")

    @property
    def fp32_from_fp32_groups(self) -> Groups:
        return self._groups(2, "fp32_from_fp32_groups")

    @property
    def all_fp16_params(self) -> List[torch.Tensor]:
        return [param for group in self._groups(0, "all_fp16_params") for param in group]

    @property
    def all_fp32_from_fp16_params(self) -> List[torch.Tensor]:
        return [param for group in self._groups(1, "all_fp32_from_fp16_params") for param in group]

    @property
    def all_fp32_from_fp32_params(self) -> List[torch.Tensor]:
        return [param for group in self._groups(2, "all_fp32_from_fp32_params") for param in group]
