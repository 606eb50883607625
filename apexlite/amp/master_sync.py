"""O2's fp32 masters meet the model's weights once more, where apex first built them.

apex built its masters lazily, from the low-precision model weights, at the first backward (`scale_loss`),
`zero_grad` or `add_param_group`. apexlite builds them in `amp.initialize`, from the fp32 weights before
the cast. Whatever writes the model's weights in between would otherwise be undone by the first step,
which copies the masters into the model: `model.load_state_dict(...)` after `initialize` (fine-tuning from
weights alone), DDP's broadcast of rank 0's weights, a `Reducer` or a manual broadcast. So at that first
use, each master whose model param no longer holds the master's value rounded to the param's dtype is
rebuilt from that param, as apex would have built it; the others keep their fp32 precision. Loading an
optimizer checkpoint counts as that first use: it sets the masters itself.

The same check runs again at the first use after a `load_state_dict` of a model amp cast (a hook on each of
its modules with params re-arms it): a run that reloads its best weights mid-training keeps them, where
apex's next step reverted them. Writes by other means after the first use (`param.data.copy_(...)`) are
not seen: the masters are the truth, and `amp.master_params(optimizer)` is where to write.

With several processes (torch.distributed initialised, world size > 1) every master is rebuilt from its
model param at the first use, as apex did: DDP broadcast rank 0's weights into the others, so a rebuild of the changed ones
alone would leave rank 0 its fp32 weights and the others their rounded copies, and the ranks would part by
a rounding error. Masters restored from a checkpoint (carried into initialize) are kept either way.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch
import torch.distributed as dist

from apexlite.amp.errors import AmpUsageError
from apexlite.amp.model_loads import Loaded
from apexlite.amp.opt_levels import LOW_PRECISION_DTYPES
from apexlite.amp.session import current_session


def rebuild_changed_masters(pairs: List[Tuple[torch.Tensor, torch.Tensor]], every: bool = False) -> int:
    """Copy each model param into its fp32 master where the param is no longer the master rounded to
    its dtype (`every`: into every master); returns how many were copied."""
    rebuilt = 0
    with torch.no_grad():
        for param, master in pairs:
            if every or not torch.equal(param, master.to(param.dtype)):
                master.copy_(param)
                rebuilt += 1
    return rebuilt


def several_processes() -> bool:
    """Whether torch.distributed runs more than one process (DDP may all-reduce grads across them)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class MasterSync:
    """Runs `rebuild_changed_masters` on an optimizer's (model param, master) pairs once, at its first use."""

    def __init__(self, pairs: Callable[[], List[Tuple[torch.Tensor, torch.Tensor]]], label: str,
                 carried: bool = False) -> None:
        self._pairs = pairs
        self._label = label
        self.done = False
        self.carried = carried  # the masters came from a checkpoint: only changed params rebuild theirs
        self._loaded: Set[int] = set()  # ids of params whose masters took loaded fp32 values since the last use

    def rearm(self, loaded: Loaded) -> None:
        """The model's weights are being loaded (`loaded`: the values written so far, by id of param): those
        masters take them now; at the next use, the masters of other params that changed are rebuilt from them."""
        if loaded:
            self._loaded.update(take_loaded_masters(self._pairs(), loaded))
        self.done = False
        self.carried = True

    def written(self, params: List[torch.Tensor], masters: List[torch.Tensor]) -> List[bool]:
        """For each param, whether the model wrote it since its master was last in use (a load, which may have set
        the master too, or another write the master does not round to)."""
        return [id(param) in self._loaded or not torch.equal(param, master.to(param.dtype))
                for param, master in zip(params, masters)]

    def settle(self) -> None:
        """An optimizer checkpoint set the masters: nothing is left to rebuild."""
        self.done = True
        self._loaded.clear()

    def __call__(self) -> None:
        if self.done:
            return
        session = current_session(required=False)
        if session is not None and session.model_loads.values:  # a load cut short: its values, first
            hand_over_loads(session)
        self.done = True
        self._loaded.clear()
        pairs = self._pairs()
        every = not self.carried and several_processes()
        rebuilt = rebuild_changed_masters(pairs, every=every)
        if session is None:
            return
        if every:
            session.info("%s: the %d fp32 master weights were rebuilt from the model's weights at the first backward, "
                         "as apex built them, so every process starts from the same ones", self._label, len(pairs))
        elif rebuilt:
            session.info("%s: %d of %d model params were written after amp.initialize or a load_state_dict (loaded "
                         "weights, a broadcast); their fp32 master weights were rebuilt from them", self._label,
                         rebuilt, len(pairs))


def take_loaded_masters(pairs: List[Tuple[torch.Tensor, torch.Tensor]], loaded: Loaded) -> List[int]:
    """Each master whose param a `load_state_dict` just wrote takes the loaded value (the param holds it rounded),
    so a run fine-tuned from fp32 weights loaded after initialize starts from them unrounded; returns the ids of
    the params whose masters were set."""
    taken = []
    with torch.no_grad():
        for param, master in pairs:
            param_and_value = loaded.get(id(param))
            if param_and_value is None or param_and_value[0] is not param:
                continue
            value = param_and_value[1]
            if torch.equal(param, value.to(device=param.device, dtype=param.dtype)):  # the load did write it
                master.copy_(value)
                taken.append(id(param))
    return taken


def hand_over_loads(session: Any) -> None:
    """Every optimizer of the session takes the values the model loads wrote (model_loads.py)."""
    loaded = session.model_loads.take()
    for amp_optimizer in list(session.optimizers.values()):
        amp_optimizer.grads.weights_loaded(loaded)


class MastersFollowLoads:
    """The ``load_state_dict`` hooks on each module of an O2 model: the pre-hook (`read`) notes the values loaded
    into low-precision params and re-arms every optimizer's master check (a load that raises half-way still
    counts); the post-hook of the module the load was called on hands the values to the masters (model_loads.py).
    It holds its session weakly, and a copied or unpickled model (``copy.deepcopy``, ``torch.save(model)``, an
    EMA copy) gets an inert one: the copy's params are no optimizer's, and the session itself cannot be copied."""

    def __init__(self, session: Optional[Any]) -> None:
        self._session = weakref.ref(session) if session is not None else None

    def _live_session(self) -> Optional[Any]:
        session = self._session() if self._session is not None else None
        return session if session is not None and not session.closed else None

    def read(self, module: torch.nn.Module, state_dict: Dict[str, Any], prefix: str, local_metadata: Dict[str, Any],
             *_: Any) -> None:
        session = self._live_session()
        if session is None:
            return
        if local_metadata.get("assign_to_params_buffers") and module._parameters:
            raise AmpUsageError(
                f"{type(module).__name__}.load_state_dict(..., assign=True) after an O2 amp.initialize would put the "
                "checkpoint's tensors in place of the low-precision params amp made and the optimizer's masters "
                "follow; load without assign=True (values are copied in and cast) or load before amp.initialize.")
        loads = session.model_loads
        if (not prefix or module in session.models) and loads.begin(module):  # a load's root (model_loads.py)
            hand_over_loads(session)  # what an earlier load cut short by an exception wrote
        noted = False
        for name, param in module._parameters.items():
            value = state_dict.get(prefix + name)
            if (param is not None and param.dtype in LOW_PRECISION_DTYPES and isinstance(value, torch.Tensor)
                    and value.is_floating_point() and value.shape == param.shape):
                session.model_loads.note(param, value)
                noted = True
        if noted:
            for amp_optimizer in list(session.optimizers.values()):
                amp_optimizer.grads.weights_loaded({})

    def __call__(self, module: torch.nn.Module, incompatible: Any) -> None:
        session = self._live_session()
        if session is not None and session.model_loads.end(module):
            hand_over_loads(session)

    def __reduce__(self) -> tuple:
        return (MastersFollowLoads, (None,))

    def __deepcopy__(self, memo: dict) -> "MastersFollowLoads":
        return MastersFollowLoads(None)
