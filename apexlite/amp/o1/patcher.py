"""Patcher: every global change apexlite makes is recorded here and undone exactly, last first.

An attribute that the target owned (`name in vars(target)`) is set back to the very same object;
an attribute that was inherited or resolved dynamically (most `torch.Tensor` methods live on the C
base class, `torch._VF` resolves names through `__getattr__`) is deleted, so no shadowing copy is
left behind. Hook handles and arbitrary undo callbacks are recorded the same way.
"""
from __future__ import annotations

import importlib
import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

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
    """One undoable change; `key` is (id(target), name) for a replaced attribute."""

    description: str
    undo: Callable[[], None]
    key: Optional[Tuple[int, str]] = None
    target: Callable[[], Any] = lambda: None
    name: Optional[str] = None


def _strongly(obj: Any) -> Callable[[], Any]:
    return lambda: obj


class Patcher:
    """Applies patches and undoes them exactly, in reverse order. Refuses to patch one name twice.

    NOTE [patches never keep a model or optimizer alive]
    A patch on an instance (an optimizer's `step`, a model's hooks) refers to it weakly: a program
    that drops a model or optimizer (a loop over opt levels, a test per configuration, a fresh model
    per checkpoint) frees it, and its records leave this patcher when it is collected, undone by its
    death. Patches on modules and classes (torch's functions) hold them strongly. The original value
    of a replaced attribute is held as it was, to be set back identically: an instance attribute that
    was a method bound to the instance itself thus keeps it alive until undone. Lookups are by
    (id, name), so the cost of a patch does not grow with the number made before it.
    """

    def __init__(self) -> None:
        self._records: Dict[int, PatchRecord] = {}  # sequence number -> record, oldest first
        self._attributes: Dict[Tuple[int, str], int] = {}  # (id(target), name) -> sequence number
        self._owned: Dict[int, List[int]] = {}  # id(weak reference to an owner) -> its records' numbers
        self._next = 0

    def __len__(self) -> int:
        return len(self._records)

    def mark(self) -> int:
        """A position to `undo_to`: records made after this call are undone, older ones kept."""
        return self._next

    def _reference(self, owner: Any) -> Callable[[], Any]:
        """A way back to `owner`: weak for instances (NOTE above), strong for modules, classes and
        objects that take no weak reference."""
        if isinstance(owner, (types.ModuleType, type)):
            return _strongly(owner)
        try:
            return weakref.ref(owner, self._forget_owner)
        except TypeError:
            return _strongly(owner)

    def _forget_owner(self, reference: Any) -> None:
        """An owner was collected: its records go (nothing of it is left to undo)."""
        for number in self._owned.pop(id(reference), ()):
            record = self._records.pop(number, None)
            if record is not None and record.key is not None and self._attributes.get(record.key) == number:
                del self._attributes[record.key]

    def _add(self, record: PatchRecord, reference: Optional[Callable[[], Any]] = None) -> None:
        number = self._next
        self._next += 1
        self._records[number] = record
        if record.key is not None:
            self._attributes[record.key] = number
        if isinstance(reference, weakref.ref):
            self._owned.setdefault(id(reference), []).append(number)

    def set_attribute(self, target: Any, name: str, replacement: Any) -> Any:
        """Replace (or add) `target.name`; returns the raw original (None if there was none).

        Undo sets an owned original back, and deletes an attribute that was inherited or new.
        """
        key = (id(target), name)
        label = getattr(target, "__name__", type(target).__name__)
        if key in self._attributes:
            raise AmpStateError(f"{label}.{name} is already patched by this session")
        owned = vars(target).get(name, _MISSING) if hasattr(target, "__dict__") else _MISSING
        original = raw_attribute(target, name) if hasattr(target, name) else None
        setattr(target, name, replacement)
        reference = self._reference(target)

        def undo() -> None:
            obj = reference()
            if obj is None:
                return
            if owned is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, owned)

        self._add(PatchRecord(f"{label}.{name}", undo, key, reference, name), reference)
        return original

    def patched_attributes(self) -> List[Tuple[Any, str]]:
        """(target, name) of every attribute this patcher replaced and has not undone, oldest first."""
        pairs = [(record.target(), record.name) for record in list(self._records.values()) if record.key is not None]
        return [(target, name) for target, name in pairs if target is not None]

    def descriptions(self) -> List[str]:
        """What each live record changed, oldest first (for reports and tests)."""
        return [record.description for record in list(self._records.values())]

    def add_handle(self, handle: Any, description: str, owner: Any = None) -> None:
        """Record a hook handle (anything with `.remove()`); with `owner`, the record goes when it is collected."""
        if owner is None:
            self._add(PatchRecord(description, handle.remove))
            return
        reference = self._reference(owner)  # kept by the record: a collected weak reference calls back nobody
        self._add(PatchRecord(description, handle.remove, target=reference), reference)

    def add_undo(self, undo: Callable[[], None], description: str) -> None:
        """Record an arbitrary undo step."""
        self._add(PatchRecord(description, undo))

    def undo_all(self) -> None:
        """Undo every record, newest first. Idempotent; raises after trying all if any undo failed."""
        self.undo_to(0)

    def undo_to(self, mark: int) -> None:
        """Undo the records made since `mark()` returned `mark` (a failed initialize's), newest first."""
        errors = []
        while self._records:
            number = next(reversed(self._records))
            if number < mark:
                break
            record = self._records.pop(number)
            if record.key is not None and self._attributes.get(record.key) == number:
                del self._attributes[record.key]
            try:
                record.undo()
            except Exception as exc:  # keep undoing the rest, then report
                errors.append(f"{record.description}: {exc!r}")
        if errors:
            raise AmpStateError("could not undo every patch: " + "; ".join(errors))
