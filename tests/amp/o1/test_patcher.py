"""Patcher: every change undone exactly, newest first; patches on instances never keep them alive.

References are plain Python semantics: after undo an owned attribute is the identical object, an
inherited or new one is gone; a dropped instance is collected and its records leave the patcher.
"""
import gc
import types
import weakref

import pytest

from apexlite.amp.errors import AmpStateError
from apexlite.amp.o1.patcher import Patcher


class Target:
    def method(self):
        return "class"


class Handle:
    """A hook handle stand-in: counts removals."""

    def __init__(self):
        self.removed = 0

    def remove(self):
        self.removed += 1


def _replacement(self):
    return "patched"


# (name, target factory, attribute): an instance attribute that was owned, inherited, or absent
CASES = [
    ("owned_instance_attribute", lambda: _with(Target(), "value", 1), "value"),
    ("inherited_method", Target, "method"),
    ("new_attribute", Target, "absent"),
    ("class_attribute", lambda: Target, "method"),
    ("module_attribute", lambda: _with(types.ModuleType("m"), "f", len), "f"),
]


def _with(obj, name, value):
    setattr(obj, name, value)
    return obj


@pytest.mark.parametrize("make,name", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_undo_restores_exactly(make, name):
    target = make()
    owned_before = vars(target).get(name, "<missing>")
    patcher = Patcher()
    patcher.set_attribute(target, name, "replacement")
    assert getattr(target, name) == "replacement"
    patcher.undo_all()
    assert vars(target).get(name, "<missing>") is owned_before
    assert len(patcher) == 0


def test_second_patch_of_one_name_is_refused_until_undone():
    target, patcher = Target(), Patcher()
    patcher.set_attribute(target, "method", _replacement)
    with pytest.raises(AmpStateError, match="already patched"):
        patcher.set_attribute(target, "method", _replacement)
    patcher.undo_all()
    patcher.set_attribute(target, "method", _replacement)
    patcher.undo_all()


def test_undo_to_a_mark_keeps_older_records_and_undoes_newest_first():
    target, patcher, order = Target(), Patcher(), []
    patcher.add_undo(lambda: order.append("first"), "first")
    mark = patcher.mark()
    patcher.add_undo(lambda: order.append("second"), "second")
    patcher.add_undo(lambda: order.append("third"), "third")
    patcher.set_attribute(target, "value", 5)
    patcher.undo_to(mark)
    assert order == ["third", "second"] and not hasattr(target, "value")
    assert patcher.descriptions() == ["first"]


def test_an_instance_patched_and_dropped_is_collected_and_its_records_leave():
    target, patcher = Target(), Patcher()
    patcher.set_attribute(target, "method", types.MethodType(_replacement, target))  # the instance refers to itself
    handle = Handle()
    patcher.add_handle(handle, "a hook on the target", owner=target)
    patcher.add_undo(lambda: None, "an unowned step")
    alive = weakref.ref(target)
    del target
    gc.collect()
    assert alive() is None
    assert patcher.descriptions() == ["an unowned step"]
    patcher.undo_all()
    assert handle.removed == 0  # its owner is gone: nothing is left to unhook


def test_an_owned_handle_is_removed_while_its_owner_lives():
    target, patcher, handle = Target(), Patcher(), Handle()
    patcher.add_handle(handle, "hook", owner=target)
    patcher.undo_all()
    assert handle.removed == 1


def test_undo_of_a_collected_target_between_marks_is_skipped():
    patcher, survivor = Patcher(), Target()
    mark = patcher.mark()
    doomed = Target()
    patcher.set_attribute(doomed, "value", 1)
    patcher.set_attribute(survivor, "value", 2)
    del doomed
    gc.collect()
    patcher.undo_to(mark)
    assert not hasattr(survivor, "value") and len(patcher) == 0


def test_classes_and_modules_are_held_strongly():
    patcher = Patcher()
    klass = type("Transient", (), {})
    patcher.set_attribute(klass, "flag", True)
    alive = weakref.ref(klass)
    del klass
    gc.collect()
    assert alive() is not None and alive().flag is True
    patcher.undo_all()
    assert not hasattr(alive(), "flag")
