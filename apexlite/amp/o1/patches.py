"""Applies the O1 op tables and the user's registrations to torch through the session's O1 Patcher.

The O1 layer is installed at most once per session (a later `initialize` never stacks wrappers on
wrappers); it is reinstalled only when new user registrations must join it, and removed when the
latest `initialize` no longer patches torch (or by a handle's `_deactivate()`).
"""
from __future__ import annotations

from typing import Any, List, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.amp.o1.data_loading import keep_casts_out_of_data_loading
from apexlite.amp.o1.device_scope import follow_model_moves
from apexlite.amp.o1.compiled_graphs import forget_compiled_graphs, keep_graphs_in_step
from apexlite.amp.o1.lists import OpEntry, op_entries
from apexlite.amp.o1.patcher import raw_attribute, resolve
from apexlite.amp.o1.policies import CastPolicy
from apexlite.amp.o1.rnn_input import patch_rnn_input_check
from apexlite.amp.o1.torchscript import patch_torch_jit, register_script_builtin
from apexlite.amp.o1.transformer_fast_path import turn_off_transformer_fast_path
from apexlite.amp.o1.wrappers import make_wrapper

log = get_logger("amp")


def torch_version() -> Tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def applicable_entries() -> List[OpEntry]:
    """The table entries whose version gate the installed torch passes."""
    version = torch_version()
    return [e for e in op_entries() if e.min_torch is None or version >= e.min_torch]


def o1_installed(session: Any) -> bool:
    return len(session.o1_patcher) > 0


def set_o1_patches(session: Any, wanted: bool, new_registrations: List[Tuple[Any, str, CastPolicy]]) -> None:
    """Bring the session's O1 layer to `wanted`, adding `new_registrations` to the ones it holds."""
    if not wanted:
        session.o1_patcher.undo_all()
        session.cast_state.active = False
        return
    if not o1_installed(session) or new_registrations:
        registrations = session.o1_registrations + list(new_registrations)
        session.o1_patcher.undo_all()
        try:
            keep_graphs_in_step(session.o1_patcher)  # first: its undo runs after every patch is gone
            patch_torch_functions(session, registrations)
        except BaseException:
            session.o1_patcher.undo_all()
            raise
        session.o1_registrations = registrations
    elif session.cast_state.low_dtype is not session.o1_graph_dtype:
        forget_compiled_graphs()  # graphs compiled under O1 cast to the old dtype
    session.o1_graph_dtype = session.cast_state.low_dtype
    session.cast_state.active = True


def patch_torch_functions(session: Any, registrations: List[Tuple[Any, str, CastPolicy]]) -> int:
    """Install every O1 wrapper; user registrations win over table entries for the same name."""
    patched = set()
    count = 0
    for module, name, policy in registrations:
        _install(session, module, name, policy, f"{getattr(module, '__name__', module)}.{name}")
        patched.add((id(module), name))
        count += 1
    for entry in applicable_entries():
        target = resolve(entry.namespace)
        if (id(target), entry.name) in patched:
            continue
        if not hasattr(target, entry.name):
            log.debug("skipping %s: not present in torch %s", entry.qualname, torch.__version__)
            continue
        _install(session, target, entry.name, entry.policy, entry.qualname)
        count += 1
    patch_rnn_input_check(session.cast_state, session.o1_patcher)
    patch_torch_jit(session.o1_patcher, session.cast_state)
    turn_off_transformer_fast_path(session.o1_patcher)
    keep_casts_out_of_data_loading(session.o1_patcher, session.cast_state)
    follow_model_moves(session.o1_patcher, session)
    return count


def _install(session: Any, target: Any, name: str, policy: CastPolicy, qualname: str) -> None:
    original = raw_attribute(target, name)
    wrapper = make_wrapper(policy, session.cast_state, original, qualname, (target, name))
    session.o1_patcher.set_attribute(target, name, wrapper)
    register_script_builtin(session.o1_patcher, original, wrapper, qualname)  # NOTE [TorchScript]
