"""apex's O1 cast lists (`apex.amp.lists.*_overrides.FP16_FUNCS`, ...) as lists that act on apexlite's O1.

apex read these lists every time `amp.init` / `amp.initialize` patched torch, so a script could append
an op name to one beforehand to have it cast. Here appending (`append`, `extend`, `insert`, `+=`)
registers the name as `amp.register_half_function` / `register_float_function` /
`register_promote_function` would, for the next `amp.initialize` / `amp.init` (apexlite's own op
tables, apexlite/amp/o1/lists.py, hold what O1 patches by default). Every other change (removing,
replacing, rebinding the list) raises, since apexlite cannot honour it: nothing is silently ignored.
"""
from __future__ import annotations

import types
from typing import Any, Iterable, Optional

from apexlite._logging import get_logger
from apexlite.amp.o1.policies import CastPolicy
from apexlite.amp.o1.registry import PendingRegistrations

log = get_logger("amp")


class CastListChangeError(TypeError):
    """A change to an apex cast list that apexlite cannot honour."""


def _refused(list_name: str, what: str) -> CastListChangeError:
    return CastListChangeError(
        f"{what} {list_name} is not supported by apexlite: its O1 op tables (apexlite/amp/o1/lists.py) decide what "
        "is cast. Only appending a name takes effect (as amp.register_half_function / register_float_function / "
        "register_promote_function would); to keep an op out of O1's casts, wrap the call in "
        "`with amp.disable_casts():`.")


class CastList(list):
    """One of apex's cast lists: its names as apex had them; appending registers the op with O1."""

    def __init__(self, qualname: str, namespace: Any, policy: Optional[CastPolicy], names: Iterable[Any]) -> None:
        super().__init__(names)
        self.qualname, self.namespace, self.policy = qualname, namespace, policy

    def _register(self, names: Iterable[Any]) -> None:
        names = list(names)
        if self.policy is None:
            raise _refused(self.qualname, "Adding to")
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"{self.qualname} holds op names (str); got {name!r}")
            PendingRegistrations.add(self.namespace, name, self.policy)
            log.info("%s: %s.%s will be cast (%s) from the next amp.initialize / amp.init", self.qualname,
                     getattr(self.namespace, "__name__", self.namespace), name, self.policy.value)
        super().extend(names)

    def append(self, name: Any) -> None:
        self._register([name])

    def extend(self, names: Iterable[Any]) -> None:
        self._register(names)

    def insert(self, index: int, name: Any) -> None:
        self._register([name])

    def __iadd__(self, names: Iterable[Any]) -> "CastList":
        self._register(names)
        return self

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise _refused(self.qualname, "Changing")

    remove = pop = clear = sort = reverse = __setitem__ = __delitem__ = __imul__ = _refuse


class CastListsModule(types.ModuleType):
    """A module holding cast lists: rebinding one of them raises instead of being silently ignored."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(self.__dict__.get(name), CastList):
            raise _refused(f"{self.__name__}.{name}", "Rebinding")
        super().__setattr__(name, value)


def protect(module: types.ModuleType) -> None:
    """Make `module` refuse rebinding its cast lists."""
    module.__class__ = CastListsModule
