"""WeakOrderedSet: the session's registered models, by identity, in registration order, held weakly.

A session lives as long as the process (NOTE [one session per process] in session.py); a model the
program has dropped must leave it rather than stay alive, in memory and in every later registration
walk (NOTE [patches never keep a model or optimizer alive] in o1/patcher.py).
"""
from __future__ import annotations

import weakref
from typing import Dict, Generic, Iterable, Iterator, List, TypeVar

T = TypeVar("T")


class WeakOrderedSet(Generic[T]):
    """Objects compared by identity, in insertion order; one that is collected leaves the set."""

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._refs: Dict[int, "weakref.ref[T]"] = {}
        for item in items:
            self.add(item)

    def _forget(self, key: int, reference: "weakref.ref[T]") -> None:
        if self._refs.get(key) is reference:
            del self._refs[key]

    def add(self, item: T) -> bool:
        """Add `item` (True) unless it is already in the set (False)."""
        if item in self:
            return False
        key = id(item)
        self._refs[key] = weakref.ref(item, lambda reference, key=key: self._forget(key, reference))
        return True

    def __contains__(self, item: object) -> bool:
        reference = self._refs.get(id(item))
        return reference is not None and reference() is item

    def items(self) -> List[T]:
        """The live members, oldest first."""
        alive = (reference() for reference in list(self._refs.values()))
        return [item for item in alive if item is not None]

    def __iter__(self) -> Iterator[T]:
        return iter(self.items())

    def __len__(self) -> int:
        return len(self.items())

    def clear(self) -> None:
        self._refs.clear()
