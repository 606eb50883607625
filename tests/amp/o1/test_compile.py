"""torch.compile over apexlite models: compiled O1/O2 steps equal eager ones, disable_casts is honoured.

The `aot_eager` backend runs the ATen ops torch.compile captured without code generation, so results
are comparable bit for bit with eager mode on CPU (and it compiles in about a second).
"""
import copy

import pytest
import torch

from apexlite import amp
from tests._helpers.torch_snapshot import warm_up_torch_compile

warm_up_torch_compile()

pytestmark = [pytest.mark.usefixtures("cast_path"),  # native and pure-Python O1 casts
              pytest.mark.skipif(not hasattr(torch, "compile"), reason="needs torch.compile")]


class TwoBlocks(torch.nn.Module):
    """A Linear under O1's casts, then one that runs with casts off (a 'custom op' block)."""

    def __init__(self, protect: bool) -> None:
        super().__init__()
        self.first = torch.nn.Linear(16, 8)
        self.second = torch.nn.Linear(8, 4)
        self.protect = protect

    def forward(self, x):
        hidden = torch.relu(self.first(x))
        if self.protect:
            with amp.disable_casts():
                return self.second(hidden.float())
        return self.second(hidden)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _train(model, optimizer, x, steps, compiled):
    forward = torch.compile(model, backend="aot_eager") if compiled else model
    outputs = []
    for _ in range(steps):
        out = forward(x)
        outputs.append(out.detach().clone())
        with amp.scale_loss(out.float().pow(2).mean(), optimizer) as scaled:
            scaled.backward()
        optimizer.step()
        optimizer.zero_grad()
    return outputs, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("opt_level,protect", [("O1", False), ("O1", True), ("O2", False)], ids=str)
def test_compiled_training_equals_eager(opt_level, protect):
    torch.manual_seed(0)
    base = TwoBlocks(protect)
    x = torch.randn(8, 16)
    results = []
    for compiled in (False, True):
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, dtype=torch.bfloat16,
                                          loss_scale="dynamic", verbosity=0)
        try:
            results.append(_train(model, optimizer, x, steps=3, compiled=compiled))
        finally:
            amp.deinitialize()
    (eager_outs, eager_params), (compiled_outs, compiled_params) = results
    # O1 returns the last Linear's bf16 result unless it ran with casts off; O2 casts outputs to fp32
    expected_dtype = torch.bfloat16 if opt_level == "O1" and not protect else torch.float32
    for eager, compiled in zip(eager_outs + eager_params, compiled_outs + compiled_params):
        assert compiled.dtype == eager.dtype
        assert torch.equal(compiled, eager)
    assert eager_outs[0].dtype == expected_dtype


@pytest.mark.skipif(not hasattr(getattr(torch, "compiler", None), "is_compiling"),
                    reason="torch < 2.3 cannot tell apexlite that it is being compiled")
def test_disable_casts_inside_compiled_code_really_runs_without_casts():
    model = TwoBlocks(protect=True)
    amp.initialize(model, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        x = torch.randn(2, 16)
        explanation = torch._dynamo.explain(model)(x)
        compiled = torch.compile(model, backend="aot_eager")(x)
        eager = model(x)
    finally:
        amp.deinitialize()
    # the block is not traced with the casts baked in: dynamo breaks the graph there (Python path) or
    # runs the rest of the frame eagerly (native path: its switch is not traceable)
    assert explanation.graph_break_count >= 1 or explanation.break_reasons
    assert compiled.dtype == torch.float32 and torch.equal(compiled, eager)


def _graph_breaks(model_factory, native: bool, monkeypatch) -> int:
    from apexlite.amp.o1 import native_casts

    monkeypatch.setattr(native_casts, "use_native", lambda: native)
    torch._dynamo.reset()
    model = model_factory()
    amp.initialize(model, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        return torch._dynamo.explain(model)(torch.randn(2, 16)).graph_break_count
    finally:
        amp.deinitialize()


MODELS = {
    "mlp": lambda: torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU(), torch.nn.Linear(8, 4)),
    "two_blocks": lambda: TwoBlocks(protect=False),
    "two_blocks_protected": lambda: TwoBlocks(protect=True),
    "attention": lambda: torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True),
}


@pytest.mark.parametrize("name", MODELS)
def test_the_native_path_adds_no_graph_breaks(name, cast_path, monkeypatch):
    if cast_path != "native":
        pytest.skip("compares both paths itself; runs once")
    python_breaks = _graph_breaks(MODELS[name], False, monkeypatch)
    native_breaks = _graph_breaks(MODELS[name], True, monkeypatch)
    assert native_breaks <= python_breaks


def test_compiled_module_recompiles_after_deinitialize():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    x = torch.randn(8, 16)
    compiled = torch.compile(model, backend="aot_eager")
    amp.initialize(model, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        under_o1 = compiled(x)
    finally:
        amp.deinitialize()
    after = compiled(x)
    assert under_o1.dtype == torch.bfloat16
    assert after.dtype == torch.float32 and torch.equal(after, model(x))


def test_an_o1_model_compiles_in_one_graph_and_recompiles_cleanly():
    """No graph breaks from the O1 wrappers, the cast cache or the forward-scope hooks; explaining and
    then compiling the same module works (dynamo once tripped over the hooks' thread-local state)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    amp.initialize(model, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        x = torch.randn(3, 4)
        explanation = torch._dynamo.explain(model)(x)
        compiled = torch.compile(model, backend="aot_eager")(x)
        eager = model(x)
    finally:
        amp.deinitialize()
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    assert compiled.dtype is torch.bfloat16 and torch.equal(compiled, eager)


def test_a_compiled_whole_step_does_not_recompile_as_the_loss_scale_moves():
    """The unscale once traced the Python loss scale as a constant: each new scale value compiled it again, until
    dynamo's recompile limit sent it back to eager with a warning. The reference is the eager run's parameters."""
    from torch._dynamo.utils import counters

    def run(compiled):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        model, opt = amp.initialize(model, opt, opt_level="O1", dtype=torch.bfloat16, loss_scale="dynamic",
                                    verbosity=0)

        def step(x):
            loss = model(x).float().pow(2).mean()
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
            opt.step()
            opt.zero_grad()

        step = torch.compile(step, backend="aot_eager") if compiled else step
        x = torch.randn(4, 8)
        graphs = []
        try:
            for i in range(16):
                step(x * (1e38 if i % 2 == 0 else 1.0))  # every other step overflows: the scale halves
                graphs.append(counters["stats"]["unique_graphs"])
            return [p.detach().clone() for p in model.parameters()], graphs
        finally:
            amp.deinitialize()

    eager, _ = run(compiled=False)
    compiled, graphs = run(compiled=True)
    assert graphs[4] == graphs[-1]  # no new graph once the first steps compiled, whatever the scale
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))


@pytest.mark.parametrize("heads", ["3-D", "4-D"])
def test_attention_backward_under_aot_eager_equals_eager(heads, cast_path):
    """torch's decomposition of the CPU attention math upcasts to fp32 and calls torch.bmm, which O1 cast back to
    bf16 while the graph was traced: the 3-D backward raised a dtype mismatch. The reference is eager O1."""
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.query = torch.nn.Linear(8, 8)

        def forward(self, h):
            if heads == "4-D":
                h = h.unsqueeze(1)
            return torch.nn.functional.scaled_dot_product_attention(self.query(h), h, h).float().sum()

    def grads(compiled):
        torch.manual_seed(0)
        model = Attention()
        amp.initialize(model, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
        try:
            forward = torch.compile(model, backend="aot_eager") if compiled else model
            forward(torch.randn(2, 6, 8)).backward()
            return [param.grad.clone() for param in model.parameters()]
        finally:
            amp.deinitialize()

    eager = grads(compiled=False)
    compiled = grads(compiled=True)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=0.02, atol=0.02)


class UsesRenamedBuiltins(torch.nn.Module):
    """Ops whose torch builtin is defined under another name than where O1 patches it (F.linear is
    torch._C._nn.linear, F.conv2d is torch.conv2d, torch.einsum lives in torch.functional, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3)
        self.proj = torch.nn.Linear(64, 8)

    def forward(self, x):
        hidden = torch.nn.functional.gelu(self.conv(x)).flatten(1)
        out = self.proj(hidden)
        return torch.einsum("bi,bj->bij", out, out)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_code_calls_the_patched_ops_whatever_the_backend(backend):
    """The "eager" backend runs the Python code torch.fx writes for the captured graph, which names each op by
    its qualified name: the O1 patch must be what that name reaches, or the compiled model ran in fp32."""
    torch.manual_seed(0)
    model = UsesRenamedBuiltins()
    amp.initialize(model, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        x = torch.randn(2, 2, 6, 6)
        eager = model(x)
        compiled = torch.compile(model, backend=backend)(x)
    finally:
        amp.deinitialize()
    assert compiled.dtype == eager.dtype == torch.bfloat16
    assert torch.equal(compiled, eager)


def test_every_patched_function_is_reached_by_its_qualified_name():
    from torch.fx.node import _get_qualified_name

    from apexlite.amp.session import current_session

    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    try:
        for target, name in current_session().o1_patcher.patched_attributes():
            if isinstance(target, type):
                continue
            patch = getattr(target, name)
            module, _, attribute = _get_qualified_name(patch).rpartition(".")
            assert getattr(eval(module, {"torch": torch}), attribute) is patch, (target, name)
    finally:
        amp.deinitialize()
