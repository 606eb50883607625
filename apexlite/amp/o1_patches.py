"""Applies the O1 op tables and the user's registrations to torch through the session's Patcher."""
from __future__ import annotations

from typing import Any, List, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.amp.lists import OpEntry, op_entries
from apexlite.amp.patcher import raw_attribute, resolve
from apexlite.amp.policies import CastPolicy
from apexlite.amp.wrappers import make_wrapper

log = get_logger("amp")


def torch_version() -> Tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def applicable_entries() -> List[OpEntry]:
    """The table entries whose version gate the installed torch passes."""
    version = torch_version()
    return [e for e in op_entries() if e.min_torch is None or version >= e.min_torch]


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
    return count


def _install(session: Any, target: Any, name: str, policy: CastPolicy, qualname: str) -> None:
    original = raw_attribute(target, name)
    wrapper = make_wrapper(policy, session.cast_state, original, qualname)
    session.patcher.set_attribute(target, name, wrapper)
