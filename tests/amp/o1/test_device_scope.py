"""O1 casts only on the device types its models live on (NOTE [device scope]), as torch.autocast casts on the
one device type it is entered for and apex cast CUDA tensors only. Without a GPU here, a scope of the meta
device alone stands for a GPU model's (its CPU data pipeline and metrics must run as written), and meta
tensors stand for the other device beside a CPU model; the CUDA test runs where there is CUDA. The reference
for out-of-scope work is plain torch, the same call with casts off."""
import pytest
import torch
import torch.nn.functional as F

from apexlite import amp

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

LOW = torch.bfloat16


def plain_and_o1(fn):
    """(fn() with casts off, fn() under the active session): an exception counts as its type."""
    results = []
    for casts_off in (True, False):
        try:
            if casts_off:
                with amp.disable_casts():
                    results.append(fn())
            else:
                results.append(fn())
        except Exception as error:  # the same refusal plain torch gives is the same outcome
            results.append(type(error))
    return results


def same(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and (a.is_meta or torch.equal(a, b))
    return a is b


def cpu_tensors():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(4, 4, generator=gen) for _ in range(3)]


OUT_OF_SCOPE_CALLS = {  # name -> call on CPU tensors (fp32 unless said), none of which O1 may touch
    "matmul": lambda a, b, c: torch.matmul(a, b),
    "linear": lambda a, b, c: F.linear(a, b, c[0]),
    "softmax of bf16": lambda a, b, c: F.softmax(a.to(LOW), -1),
    "cat of fp32 and bf16": lambda a, b, c: torch.cat([a, b.to(LOW)]),
    "addcmul of mixed dtypes": lambda a, b, c: torch.addcmul(a, b.to(LOW), c),
    "in-place exp_ of bf16": lambda a, b, c: a.to(LOW).exp_(),
    "banned binary_cross_entropy of bf16": lambda a, b, c: F.binary_cross_entropy(a.sigmoid().to(LOW),
                                                                                   b.sigmoid().to(LOW)),
}


def only_meta_in_scope():
    """A session whose scope is one device type other than the CPU, as a model on a GPU gives (models on the
    meta device are refused by initialize, and there is no GPU here)."""
    from apexlite.amp.session import current_session

    current_session().cast_state.device_types = frozenset({"meta"})


@pytest.mark.parametrize("call", list(OUT_OF_SCOPE_CALLS))
def test_cpu_work_beside_a_model_elsewhere_runs_as_plain_torch(call):
    amp.initialize(torch.nn.Linear(4, 4), opt_level="O1", dtype=LOW, verbosity=0)
    try:
        only_meta_in_scope()
        plain, o1 = plain_and_o1(lambda: OUT_OF_SCOPE_CALLS[call](*cpu_tensors()))
        assert torch.mm(torch.randn(2, 4, device="meta"), torch.randn(4, 4, device="meta")).dtype == LOW
    finally:
        amp.deinitialize()
    assert same(plain, o1), (plain, o1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_model_leaves_cpu_work_alone():
    model = torch.nn.Linear(4, 4).cuda()
    amp.initialize(model, opt_level="O1", verbosity=0)
    try:
        assert amp_device_types() == {"cuda"}
        a, b = torch.randn(4, 4), torch.randn(4, 4)
        with amp.disable_casts():
            expected = torch.mm(a, b)
        got = torch.mm(a, b)
        assert got.dtype == torch.float32 and torch.equal(got, expected)
        assert model(torch.randn(2, 4, device="cuda")).dtype == torch.float16
    finally:
        amp.deinitialize()


def test_tensors_on_another_device_than_a_cpu_model_are_not_cast():
    amp.initialize(torch.nn.Linear(4, 4), opt_level="O1", dtype=LOW, verbosity=0)
    try:
        assert amp_device_types() == {"cpu"}
        a, b = torch.randn(4, 4, device="meta"), torch.randn(4, 4, device="meta")
        assert torch.mm(a, b).dtype == torch.float32
        assert torch.cat([a, b.to(LOW)]).dtype == torch.float32  # torch's promotion, nothing of O1's
        assert torch.mm(torch.randn(4, 4), torch.randn(4, 4)).dtype == LOW
    finally:
        amp.deinitialize()


def test_a_model_moved_after_initialize_takes_the_casts_along():
    """apex wanted the model on its device first; a script that moves it after initialize gets O1's casts on
    the new device from the move on, and the old device's work runs as written."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    amp.initialize(model, opt_level="O1", dtype=LOW, verbosity=0)
    try:
        model.to("meta")
        assert amp_device_types() == {"meta"}
        x = torch.randn(3, 4, device="meta")
        assert model(x).dtype == LOW and torch.mm(x, x.t()).dtype == LOW
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float32
    finally:
        amp.deinitialize()


def test_a_compiled_model_moved_after_initialize_is_cast_on_its_new_device():
    """Compiled graphs hold O1's casts as traced, under the scope of that moment: a move drops them."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    amp.initialize(model, opt_level="O1", dtype=LOW, verbosity=0)
    try:
        compiled = torch.compile(model, backend="aot_eager")
        assert compiled(torch.randn(2, 8)).dtype == LOW
        model.to("meta")
        assert compiled(torch.randn(2, 8, device="meta")).dtype == LOW
    finally:
        amp.deinitialize()


class Buffered(torch.nn.Module):
    """No params, a buffer: the device it works on is the buffer's."""

    def __init__(self):
        super().__init__()
        self.register_buffer("projection", torch.randn(4, 4))

    def forward(self, x):
        return x @ self.projection


def test_a_model_with_buffers_only_is_followed_too():
    model = Buffered()
    amp.initialize(model, opt_level="O1", dtype=LOW, verbosity=0)
    try:
        assert amp_device_types() == {"cpu"}
        model.to("meta")
        assert amp_device_types() == {"meta"}
        assert model(torch.randn(2, 4, device="meta")).dtype == LOW
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("names, expected", [({"cpu:0"}, {"cpu"}), ({"cuda", "cpu"}, {"cuda", "cpu"})])
def test_device_type_names_are_read_as_torch_reads_them(names, expected):
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", dtype=LOW, verbosity=0)
    try:
        from apexlite.amp.session import current_session

        current_session().cast_state.device_types = names
        assert amp_device_types() == expected
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == LOW
        with pytest.raises(ValueError, match="unknown device type"):
            current_session().cast_state.device_types = {"gpu"}
        assert amp_device_types() == expected  # a refused name changes nothing
    finally:
        amp.deinitialize()


def test_without_models_every_device_is_cast_on_a_machine_without_cuda():
    """apex's amp.init names no model: CUDA as in apex where there is CUDA, else every device."""
    handle = amp.init(enabled=True, loss_scale="dynamic")
    try:
        expected = {"cuda"} if torch.cuda.is_available() else None
        assert amp_device_types() == expected
        if expected is None:
            assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float16
    finally:
        handle._deactivate()
        amp.deinitialize()


def amp_device_types():
    from apexlite.amp.session import current_session

    scope = current_session().cast_state.device_types
    return None if scope is None else set(scope)


def test_a_layer_moved_alone_takes_the_casts_along():
    """`model.encoder.cuda()` moves part of a registered model: its scope follows the part too."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    amp.initialize(model, opt_level="O1", dtype=LOW, verbosity=0)
    try:
        for layer in model:
            layer.to("meta")
        assert amp_device_types() == {"meta"}
        assert model(torch.randn(2, 4, device="meta")).dtype == LOW
    finally:
        amp.deinitialize()


def test_compiled_code_that_moves_a_module_runs_under_o1():
    """The patched Module._apply is a plain function run eagerly: torch.compile traces around it."""
    model = torch.nn.Linear(4, 4)
    amp.initialize(model, opt_level="O1", dtype=LOW, verbosity=0)
    try:
        @torch.compile(backend="eager")
        def step(x):
            y = model(x)
            model.to(torch.float32)
            return y * 2

        assert step(torch.randn(2, 4)).dtype == LOW
    finally:
        amp.deinitialize()
