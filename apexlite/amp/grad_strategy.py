"""GradStrategy: what AmpOptimizer asks of the object that owns one optimizer's gradients.

Three implementations: `PlainGrads` (plain_grads.py: the optimizer steps the model params; O0, O1,
O3), `MasterParams` (master.py: separate fp32 masters in the param groups; O2 with any torch
optimizer) and `FusedMasterGrads` (fused_master.py: an optimizer that keeps its own fp32 masters and
unscales in its step; O2 with FusedAdam). AmpOptimizer calls these methods at fixed points of a
training iteration, in this order: `prepare` before a backward, `post` (or `discard_new` when the
block raised with overflowed grads) after it, then `before_step`, the optimizer's update, and
`after_step` (`abandon_step` when the update raised before finishing, `on_skip` for a skipped step).
"""
from __future__ import annotations

from typing import Any, List, Protocol, Sequence, Tuple, TypeVar, runtime_checkable

import torch

from apexlite.amp.o1.patcher import Patcher
from apexlite.amp.scaler import LossScaler
from apexlite.amp.model_loads import Loaded

T = TypeVar("T")


def spread(items: Sequence[T]) -> List[T]:
    """The first, middle and last of `items`: a clip or rescale of a model's grads touches every one of them,
    so these few stand for all at a cost that does not grow with the param count."""
    picks = {0, len(items) // 2, len(items) - 1} if items else set()
    return [items[i] for i in sorted(picks)]


@runtime_checkable
class GradStrategy(Protocol):
    """The grad bookkeeping of one optimizer under amp (see the module docstring for the call order)."""

    optimizer: Any
    update_finished: bool  # set once this step's update is done (a later post-hook may still raise)

    def install(self, patcher: Patcher) -> None:
        """Replace the optimizer methods this strategy needs (zero_grad, state_dict, ...) through `patcher`."""

    def prepare(self, scale: float = 1.0) -> None:
        """Before a backward run with loss scale `scale`: move grads already present aside, so the new ones can be
        checked alone (or, where ranks reduce grads, scale them so the backward adds to them)."""

    def post(self, scaler: LossScaler) -> None:
        """After a backward: unscale and check the new grads, then merge them with the ones set aside."""

    def new_grads(self) -> List[torch.Tensor]:
        """The grads the current backward produced."""

    def discard_new(self) -> None:
        """Drop the current backward's grads and restore the ones set aside, exactly."""

    def master_pairs(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """(model param, fp32 master) pairs; empty where the optimizer steps the model params."""

    def model_grad_sample(self) -> List[torch.Tensor]:
        """A few of the low-precision grads the last `post` left on the model params (see `spread`), which
        AmpOptimizer watches for edits before the step; empty where the optimizer steps the model params."""

    def lazy_init(self) -> None:
        """apex's lazy master init, which scripts call as `optimizer._lazy_init_maybe_master_weights()` (BERT's
        resume): the masters take the model's weights as they are now; nothing where there are no masters."""

    def weights_loaded(self, loaded: Loaded) -> None:
        """A model amp cast loaded weights (`load_state_dict`; `loaded`: the fp32 values it wrote, by id of param):
        their masters take them, and masters of other changed params follow at the next use."""

    def before_step(self) -> None:
        """The optimizer's update is about to run."""

    def after_step(self) -> None:
        """The update finished: the model follows the masters, the used grads go."""

    def abandon_step(self) -> None:
        """The update raised before finishing: leave model and masters consistent, keep the grads."""

    def on_skip(self) -> None:
        """The step is skipped for overflow: drop the grads it would have used."""

    def detach(self) -> None:
        """Session teardown: undo what the strategy changed in the optimizer."""
