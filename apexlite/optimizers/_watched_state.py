"""Optimizer state that says when code outside FusedAdam replaces a flat-buffer param's entries.

A param in FusedAdam's flat buffers keeps views of those buffers in its state (``exp_avg``,
``exp_avg_sq``, ``step``, ``master_param``). A step must notice at once, at no cost per param, when
something puts other tensors there (``opt.state[p]["exp_avg"] = t``, ``opt.state[p] = {}``,
``opt.state.clear()``, amp creating a master): the buffers would otherwise keep training values the
state no longer shows. These dicts mark a :class:`Watch` dirty on every such write; reading costs
nothing extra. They pickle and deep-copy as plain dicts; FusedAdam.state_dict() hands out plain dicts,
so checkpoints keep torch's format and load with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, Iterable


class Watch:
    """One flat buffer set's flag: set when a member's state entries change."""

    __slots__ = ("dirty",)

    def __init__(self) -> None:
        self.dirty = False


def _plain_state_map(items: Dict[Any, Any]) -> defaultdict:
    return defaultdict(dict, items)


class WatchedState(dict):
    """A member param's state dict; any write marks its set's :class:`Watch` dirty."""

    __slots__ = ("watch",)

    def __init__(self, items: Dict[str, Any], watch: Watch) -> None:
        super().__init__(items)
        self.watch = watch

    def _touch(self) -> None:
        self.watch.dirty = True

    def __setitem__(self, key: str, value: Any) -> None:
        self._touch()
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._touch()
        super().__delitem__(key)

    def __ior__(self, other: Any) -> "WatchedState":
        self._touch()
        return super().__ior__(other)

    def pop(self, *args: Any) -> Any:
        self._touch()
        return super().pop(*args)

    def popitem(self) -> Any:
        self._touch()
        return super().popitem()

    def clear(self) -> None:
        self._touch()
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._touch()
        super().update(*args, **kwargs)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self._touch()
        return super().setdefault(key, default)

    def __reduce__(self) -> Any:
        return dict, (dict(self),)


class WatchedStateMap(defaultdict):
    """``Optimizer.state`` whose writes to a member param's entry mark that param's set dirty."""

    def __init__(self, items: Dict[Any, Any], watches: Dict[Any, Watch]) -> None:
        super().__init__(dict, items)
        self.watches = watches

    def _touch(self, keys: Iterable[Any]) -> None:
        for key in keys:
            watch = self.watches.get(key)
            if watch is not None:
                watch.dirty = True

    def __setitem__(self, key: Any, value: Any) -> None:
        self._touch((key,))
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self._touch((key,))
        super().__delitem__(key)

    def __ior__(self, other: Any) -> "WatchedStateMap":
        self._touch(list(other))
        return super().__ior__(other)

    def pop(self, key: Any, *default: Any) -> Any:
        self._touch((key,))
        return super().pop(key, *default)

    def popitem(self) -> Any:
        self._touch(list(self.watches))
        return super().popitem()

    def clear(self) -> None:
        self._touch(list(self.watches))
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        incoming = dict(*args, **kwargs)
        self._touch(list(incoming))
        super().update(incoming)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self._touch((key,))
        return super().setdefault(key, default)

    def __reduce__(self) -> Any:
        return _plain_state_map, (dict(self),)

    def __copy__(self) -> defaultdict:
        return _plain_state_map(dict(self))

    copy = __copy__

    def __or__(self, other: Any) -> defaultdict:
        merged = _plain_state_map(dict(self))
        merged.update(other)
        return merged
