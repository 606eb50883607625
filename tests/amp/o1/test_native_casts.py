"""How sessions choose the O1 cast path, and what `python -m apexlite doctor` says about it."""
import subprocess
import sys

import pytest
import torch

from apexlite import amp, doctor
from apexlite.amp.o1 import native_casts
from apexlite.amp.o1.cache import CastCache
from apexlite.amp.session import current_session
from tests._helpers.user_env import QUIET_TORCH, user_environment


def test_a_built_extension_gives_the_native_path():
    try:
        import apexlite._C  # noqa: F401
    except ImportError:
        pytest.skip("apexlite._C is not built in this environment")
    # a fresh process without the suite's switches: the path is chosen once per process
    probe = ("from apexlite.amp.o1 import native_casts; "
             "print(native_casts._native_module() is not None, native_casts.status())")
    done = subprocess.run([sys.executable, "-c", probe], env=user_environment(PYTHONWARNINGS=QUIET_TORCH),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "native"]  # the extension carries the O1 types


def test_disable_env_selects_the_python_path_and_doctor_says_so(monkeypatch):
    monkeypatch.setenv(native_casts.DISABLE_ENV, "1")
    assert native_casts.status() == f"python ({native_casts.DISABLE_ENV}=1)"
    assert dict(doctor.report())["O1 casts"] == native_casts.status()
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    try:
        assert isinstance(current_session().cache, CastCache)
    finally:
        amp.deinitialize()


def test_without_the_extension_the_python_path_is_used(monkeypatch):
    monkeypatch.delenv(native_casts.DISABLE_ENV, raising=False)
    monkeypatch.setattr(native_casts, "_native_module", lambda: None)
    assert native_casts.status().startswith("python (apexlite's compiled casts are not available: ")
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        assert isinstance(current_session().cache, CastCache)
        assert torch.nn.Linear(2, 2)(torch.randn(1, 2)).dtype is torch.bfloat16
    finally:
        amp.deinitialize()


@pytest.mark.skipif(not native_casts.use_native(), reason="needs the native O1 types")
def test_native_types_reject_misuse_with_clear_errors():
    compiled = native_casts._native_module()
    with pytest.raises(TypeError, match="CastState"):
        compiled.CastWrapper(0, object(), len, "len")
    with pytest.raises(ValueError, match="unknown cast policy"):
        compiled.CastWrapper(9, native_casts._native_state_class()(torch.float16, compiled.CastCache()), len, "len")
    state = native_casts._native_state_class()(torch.float16, compiled.CastCache())
    with pytest.raises(RuntimeError, match="without a matching push_disabled"):
        state.pop_disabled()
    with pytest.raises(TypeError, match="low_dtype"):
        state.low_dtype = "fp16"
    cache = compiled.CastCache()
    with pytest.raises(TypeError, match="takes tensors; got int"):
        cache.own([torch.zeros(1), 1])
    with pytest.raises(TypeError):
        cache.own(3)
    assert not cache.owns(object())
    wrapper = compiled.CastWrapper(0, state, len, "len")
    with pytest.raises(TypeError, match="wrapper\\(wrapped, instance, args, kwargs\\)"):
        wrapper(1, 2)
