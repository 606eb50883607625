"""Issue 18 item 7: torch.jit.script and torch.jit.trace of O1 code work, with O1's casts off inside.

TorchScript code cannot call O1's Python wrappers, so scripted code calls the ATen ops the patched names
stand for, and traced code records the ops plain torch runs: both give plain torch's (fp32) program,
bit for bit, whether or not O1 is active. Outside the scripted or traced module, O1 keeps casting.
"""
import warnings

import pytest
import torch

from apexlite import amp
from tests._helpers.child_process import run_on_cast_path
from tests.amp.o1.torchscript_programs import assert_bitwise, make_net, mixed_ops

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts


def test_scripting_under_o1_compiles_plain_torchs_program(cast_path):
    """A function and a model passed to amp.initialize script, save and load; same code and bits as
    without O1 (in a fresh process: torch.jit.script caches what it compiled)."""
    result = run_on_cast_path(cast_path, ["-m", "tests.amp.o1.torchscript_programs"])
    assert result.stdout.strip().endswith("ok")


def test_an_o1_model_traces_to_plain_torchs_graph_and_follows_weight_updates():
    x = torch.randn(4, 6)
    model, plain = make_net(), make_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    try:
        model(x)  # weights already in the cast cache before the trace
        with warnings.catch_warnings():
            warnings.simplefilter("error", torch.jit.TracerWarning)  # the trace's own eager check agrees
            traced = torch.jit.trace(model, x)
        graph = str(traced.inlined_graph)
        assert "Half" not in graph and "aten::to" not in graph
        with amp.disable_casts():
            expected = plain(x)
        before_step = traced(x)
        assert_bitwise(before_step, expected)
        # a training step updates the weights in place; the traced module reads them, never a cast copy
        with amp.scale_loss(model(x).float().sum(), optimizer) as loss:
            loss.backward()
        optimizer.step()
        with torch.no_grad(), amp.disable_casts():
            for mine, theirs in zip(model.parameters(), plain.parameters()):
                theirs.copy_(mine)
            expected = plain(x)
        assert not torch.equal(traced(x), before_step)
        assert_bitwise(traced(x), expected)
        assert model(x).dtype is torch.float32 and model.first(x).dtype is torch.float16
    finally:
        amp.deinitialize()


def test_a_traced_function_records_no_casts():
    x, w = torch.randn(4, 6), torch.randn(6, 6)
    expected = mixed_ops(x, w)
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    try:
        traced = torch.jit.trace(mixed_ops, (x, w))
    finally:
        amp.deinitialize()
    assert "Half" not in str(traced.graph)
    assert_bitwise(traced(x, w), expected)


def test_script_builtins_of_the_wrappers_are_removed_with_the_patches():
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    wrapper = torch.mm
    try:
        assert torch.jit._builtins._find_builtin(wrapper) == "aten::mm"
    finally:
        amp.deinitialize()
    assert torch.jit._builtins._find_builtin(wrapper) is None
    assert torch.jit._builtins._find_builtin(torch.mm) == "aten::mm"


def _doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class _Projection:
    """A scripted class that calls a module-level function: TorchScript resolves `_doubled` in the frame that
    called torch.jit.script (torch.distributed.optim's functional optimizers are such classes)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return _doubled(x) @ self.weight


def test_a_class_scripted_under_o1_resolves_the_callers_names():
    model = torch.nn.Linear(3, 3)
    amp.initialize(model, opt_level="O1", verbosity=0)
    try:
        scripted = torch.jit.script(_Projection)
    finally:
        amp.deinitialize()
    weight, x = torch.randn(3, 2), torch.randn(4, 3)
    assert torch.equal(scripted(weight).apply(x), _Projection(weight).apply(x))


def test_torch_distributed_optim_imports_under_o1(cast_path):
    """Its functional optimizers are scripted classes, scripted at import (and amp.initialize imports it)."""
    code = ("import torch; from apexlite import amp; amp.initialize(torch.nn.Linear(2, 2), opt_level='O1', "
            "verbosity=0); import torch.distributed.optim; print('ok')")
    result = run_on_cast_path(cast_path, ["-c", code])
    assert result.stdout.strip().endswith("ok")
