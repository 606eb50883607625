"""Patcher: every global change apexlite makes is recorded here and undone exactly, last first.

An attribute that the target owned (`name in vars(target)`) is set back to the very same object;
an attribute that was inherited or resolved dynamically (most `torch.Tensor` methods live on the C
base class, `torch._VF` resolves names through `__getattr__`) is deleted, so no shadowing copy is
left behind. Hook handles and arbitrary undo callbacks are recorded the same way.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from apexlite.amp.errors import AmpStateError

_MISSING = object()


def resolve(path: str) -> Any:
    """Import `a.b.c` as a module if possible, else walk attributes from the longest importable prefix."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot resolve {path!r}")


def raw_attribute(target: Any, name: str) -> Any:
    """The attribute as stored: for classes the descriptor found along the MRO, not a bound method."""
    if isinstance(target, type):
        for klass in target.__mro__:
            if name in vars(klass):
                return vars(klass)[name]
        raise AttributeError(f"{target.__name__} has no attribute {name!r}")
    return getattr(target, name)


@dataclass
class PatchRecord:
    """One undoable change."""

    description: str
    undo: Callable[[], None]
    target: Any = None
    name: Optional[str] = None


class Patcher:
    """Applies patches and undoes them exactly, in reverse order. Refuses to patch one name twice."""

    def __init__(self) -> None:
        self._records: List[PatchRecord] = []

    def __len__(self) -> int:
        return len(self._records)

    def _check_not_patched(self, target: Any, name: str) -> None:
        for record in self._records:
            if record.target is target and record.name == name:
                raise AmpStateError(f"{record.description} is already patched by this session")

    def set_attribute(self, target: Any, name: str, replacement: Any) -> Any:
        """Replace (or add) `target.name`; returns the raw original (None if there was none).

        Undo sets an owned original back, and deletes an attribute that was inherited or new.
        """
        self._check_not_patched(target, name)
        owned = vars(target).get(name, _MISSING) if hasattr(target, "__dict__") else _MISSING
        original = raw_attribute(target, name) if hasattr(target, name) else None
        setattr(target, name, replacement)

        def undo() -> None:
            if owned is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, owned)

        label = getattr(target, "__name__", type(target).__name__)
        self._records.append(PatchRecord(f"{label}.{name}", undo, target, name))
        return original

    def patched_attributes(self) -> List[Tuple[Any, str]]:
        """(target, name) of every attribute this patcher replaced and has not undone, oldest first."""
        return [(record.target, record.name) for record in self._records if record.name is not None]

    def add_handle(self, handle: Any, description: str) -> None:
        """Record a hook handle (anything with `.remove()`)."""
        self._records.append(PatchRecord(description, handle.remove))

    def add_undo(self, undo: Callable[[], None], description: str) -> None:
        """Record an arbitrary undo step."""
        self._records.append(PatchRecord(description, undo))

    def undo_all(self) -> None:
        """Undo every record, newest first. Idempotent; raises after trying all if any undo failed."""
        self.undo_to(0)

    def undo_to(self, mark: int) -> None:
        """Undo the records made after `len(self)` was `mark`, newest first (a failed initialize's)."""
        errors = []
        while len(self._records) > mark:
            record = self._records.pop()
            try:
                record.undo()
            except Exception as exc:  # keep undoing the rest, then report
                errors.append(f"{record.description}: {exc!r}")
        if errors:
            raise AmpStateError("could not undo every patch: " + "; ".join(errors))
