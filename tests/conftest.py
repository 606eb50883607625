"""Shared fixtures: seeding and the guard that no test leaves torch patched; slow tests first."""
from __future__ import annotations

import pytest
import torch

from tests._helpers.torch_snapshot import snapshot_patch_targets


def pytest_collection_modifyitems(config, items):
    """Runs the tests marked slow (each tens of seconds to two minutes) first, in their order, so that the
    suite's worker processes (scripts/test.sh) share the short ones at the end instead of one of them
    starting a long test as the other runs out of work."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
    yield


@pytest.fixture(autouse=True)
def _torch_left_as_found():
    """Fail any test that leaves an apexlite session alive or a torch attribute replaced."""
    from apexlite.amp import session as amp_session

    before = snapshot_patch_targets()
    yield
    leaked_session = amp_session.current_session(required=False) is not None
    if leaked_session:
        amp_session.current_session().close()
    after = snapshot_patch_targets()
    changed = sorted(key for key in before if before[key] is not after.get(key))
    assert not leaked_session, "test left an apexlite session active (call amp.deinitialize())"
    assert not changed, f"test left torch patched: {changed[:10]}"


@pytest.fixture(params=["native", "python"])
def cast_path(request, monkeypatch):
    """Run an O1 test on the native cast path (apexlite._C) and on the pure-Python one.

    Sessions choose their path when created; the "python" run makes them choose Python.
    """
    from apexlite.amp.o1 import native_casts

    if request.param == "native":
        if not native_casts.use_native():
            pytest.skip(f"native O1 casts unavailable: {native_casts.status()}")
    else:
        monkeypatch.setattr(native_casts, "use_native", lambda: False)
    return request.param
