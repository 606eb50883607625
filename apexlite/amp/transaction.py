"""InitializeTransaction: `initialize` is all-or-nothing.

Everything that can be validated is validated before anything changes. What can still fail later
(an optimizer's master-weight setup, a user registration that no longer resolves, ...) rolls back:
the session's options, scalers and registries, every patch and hook recorded since the call began,
the model casts (params, grads, buffers back to their old tensors) and each optimizer's param
groups, state and instance attributes. A failed call thus leaves models, optimizers and torch as
they were, so a corrected retry works.
"""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from apexlite.amp.model_cast import UndoLog, restore_networks
from apexlite.amp.o1.compiled_graphs import keep_graphs_in_step
from apexlite.amp.o1.patches import patch_torch_functions
from apexlite.amp.o1.registry import PendingRegistrations


class _OptimizerSnapshot:
    """Param-group membership, per-param state dicts (shallow) and instance attributes of one optimizer."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.attributes = dict(vars(optimizer))
        self.groups = [(group, dict(group), list(group["params"])) for group in optimizer.param_groups]
        self.state = {param: dict(state) for param, state in optimizer.state.items()}

    def restore(self) -> None:
        optimizer = self.optimizer
        vars(optimizer).clear()
        vars(optimizer).update(self.attributes)
        optimizer.param_groups[:] = [group for group, _, _ in self.groups]
        for group, entries, params in self.groups:
            group.clear()
            group.update(entries)
            group["params"] = params
        optimizer.state.clear()
        for param, state in self.state.items():
            optimizer.state[param] = state


class InitializeTransaction:
    """Records what one `initialize` call changes so that a failure can undo all of it."""

    def __init__(self, session: Any, models: List[torch.nn.Module], optimizers: List[Any]) -> None:
        self.session = session
        self.models = models
        self.patch_mark = session.patcher.mark()
        self.model_undo: UndoLog = []
        self.optimizers = [_OptimizerSnapshot(optimizer) for optimizer in optimizers]
        self.fields: Dict[str, Any] = {
            "options": session.options, "loss_scalers": list(session.loss_scalers),
            "from_initialize": session.from_initialize, "handle": session.handle,
        }
        # the registries stay the session's weak containers; their members are put back on rollback
        self.optimizers_before = dict(session.optimizers.items())  # items() skips entries dying meanwhile
        self.models_before = session.models.items()
        self.scoped_before = session.scoped_models.items()
        state = session.cast_state
        self.cast_fields = {name: getattr(state, name) for name in ("active", "low_dtype", "log_casts",
                                                                     "allow_banned", "use_cache", "device_types")}
        self.o1_was_installed = len(session.o1_patcher) > 0
        self.o1_registrations = list(session.o1_registrations)
        self.taken_registrations: List[Any] = []

    def rollback(self) -> None:
        """Undo everything recorded; best effort for each part, so one failure does not stop the rest."""
        session = self.session
        try:
            session.patcher.undo_to(self.patch_mark)
        finally:
            restore_networks(self.model_undo, self.models)
            for snapshot in self.optimizers:
                snapshot.restore()
            for name, value in self.fields.items():
                setattr(session, name, value)
            session.optimizers.clear()
            session.optimizers.update(self.optimizers_before)
            for registry, members in ((session.models, self.models_before), (session.scoped_models, self.scoped_before)):
                registry.clear()
                for member in members:
                    registry.add(member)
            for name, value in self.cast_fields.items():
                setattr(session.cast_state, name, value)
            self._restore_o1()
            PendingRegistrations.put_back(self.taken_registrations)

    def _restore_o1(self) -> None:
        session = self.session
        session.o1_patcher.undo_all()
        session.o1_registrations = list(self.o1_registrations)
        if self.o1_was_installed:
            keep_graphs_in_step(session.o1_patcher)  # as set_o1_patches installs it: first, undone last
            patch_torch_functions(session, session.o1_registrations)
