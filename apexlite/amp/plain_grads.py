"""PlainGrads: the grad strategy (grad_strategy.GradStrategy) where the optimizer steps the model params
themselves (O0, O1, O3): grads live on those params and are unscaled and checked in place.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.amp.master_sync import several_processes
from apexlite.amp.checkpoint_convert import copy_masters_into_params, take_masters_for_params, without_marker
from apexlite.amp.o1.patcher import Patcher
from apexlite.amp.scaler import LossScaler
from apexlite.amp.model_loads import Loaded


log = get_logger("amp")


def optimizer_params(optimizer: Any) -> List[torch.Tensor]:
    """Every param the optimizer steps, in param-group order."""
    return [p for group in optimizer.param_groups for p in group["params"]]


class PlainGrads:
    """Grad handling when the optimizer steps the model params themselves (no master weights).

    Several `scale_loss` blocks before one step accumulate correctly: grads present before a backward
    are stashed (already unscaled), the new grads are unscaled and checked, then the stash is added back.
    Across ranks they stay where they are, multiplied by the loss scale, and the backward adds to them: DDP
    all-reduces what `.grad` holds, so micro-batches run under `no_sync()` reach the other ranks (stashed,
    each rank would add back its own, as with apex). With a power-of-two scale both ways give the same bits.
    """

    def __init__(self, optimizer: Any, params_fn: Optional[Callable[[], List[torch.Tensor]]] = None,
                 models_fn: Callable[[], List[torch.nn.Module]] = list) -> None:
        self.optimizer = optimizer
        self.update_finished = False  # PlainGrads has no post-hook: AmpOptimizer finishes its steps
        self._params_fn = params_fn
        self._models_fn = models_fn
        self._stash: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._in_place = False  # this backward adds to the grads already there (several_processes)

    def install(self, patcher: Patcher) -> None:
        """Let the optimizer load O2 checkpoints (masters become the params' values)."""
        self._load_state_dict = patcher.set_attribute(self.optimizer, "load_state_dict", self.load_state_dict)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """The optimizer's own load; an O2 checkpoint's fp32 masters are copied into the params."""
        state_dict = without_marker(state_dict)
        pairs = take_masters_for_params(state_dict, optimizer_params(self.optimizer), self._models_fn())
        self._load_state_dict(state_dict)
        copy_masters_into_params(pairs, self.optimizer)

    def params(self) -> List[torch.Tensor]:
        """The params whose grads this strategy manages (all of the optimizer's by default)."""
        if self._params_fn is not None:
            return self._params_fn()
        return optimizer_params(self.optimizer)

    def prepare(self, scale: float = 1.0) -> None:
        """Before a backward (see the class docstring); `scale`: the loss scale it runs with."""
        self._stash = []
        self._in_place = False
        present = [param for param in self.params() if param.grad is not None]
        if present and several_processes():
            self._in_place = True
            if scale != 1.0:
                for grad in (param.grad for param in present):
                    grad.mul_(scale)
            return
        for param in present:
            self._stash.append((param, param.grad))
            param.grad = None

    def adopt_stash(self, pairs: List[Tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Take (param, unscaled grad) pairs stashed elsewhere, to be added back by `post`."""
        self._stash = list(pairs)

    def post(self, scaler: LossScaler) -> None:
        fresh = [p.grad for p in self.params() if p.grad is not None]
        if fresh and scaler.checks_overflow:
            scaler.unscale(fresh)
        self._restore_stash()

    def new_grads(self) -> List[torch.Tensor]:
        """The grads the current backward produced (`prepare` moved every older one to the stash)."""
        return [p.grad for p in self.params() if p.grad is not None]

    def discard_new(self) -> None:
        """Drop what the current backward produced and put the older grads back, exactly as they were (across
        ranks the older grads were summed into the overflowed ones: they go too, with a warning)."""
        if self._in_place:
            log.warning("amp: a scale_loss block raised with overflowed grads, which, across ranks, hold the "
                        "earlier micro-batches' grads of this step too: they are all dropped; rerun those "
                        "micro-batches or skip the step")
        for param in self.params():
            param.grad = None
        for param, grad in self._stash:
            param.grad = grad
        self._stash = []

    def _restore_stash(self) -> None:
        both_new, both_old = [], []
        for param, stashed in self._stash:
            if param.grad is None:
                param.grad = stashed
            else:
                both_new.append(param.grad)
                both_old.append(stashed)
        if both_new:
            torch._foreach_add_(both_new, both_old)
        self._stash = []

    def master_pairs(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """(model param, fp32 master) pairs: none, the optimizer steps the model params."""
        return []

    def model_grad_sample(self) -> List[torch.Tensor]:
        """None: the optimizer steps the model params, so their grads are the ones it uses."""
        return []

    def lazy_init(self) -> None:
        """No masters here: nothing to build."""

    def weights_loaded(self, loaded: Loaded) -> None:
        """No masters here: the optimizer steps the loaded params themselves."""

    def before_step(self) -> None:
        pass

    def after_step(self) -> None:
        pass

    def abandon_step(self) -> None:
        pass

    def on_skip(self) -> None:
        """Drop the overflowed grads with the step: kept, a later backward would add to them unchecked."""
        for param in self.params():
            param.grad = None
        self._stash = []

    def detach(self) -> None:
        self._stash = []
