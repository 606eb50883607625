"""Issue 22 item 3 (and issue 18 item 6): every function O1 patches pickles and copies as itself.

A patch pickles as a reference to where it is installed (apexlite/amp/o1/function_wrappers.py), the
way Python pickles a function by its qualified name: where O1 is active the reference loads the
installed patch itself (`is`), elsewhere (a spawn worker that has not called amp.initialize, this
process after deinitialize) torch's own function. The bytes name only torch and the standard library.
The walk covers every attribute the session's O1 patcher records: the op tables (torch.*,
torch.nn.functional.*, Tensor methods, torch._VF, the banned function), user registrations,
RNNBase.check_input and torch.jit's patched entry points, on both cast paths.
"""
import copy
import copyreg
import inspect
import multiprocessing
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import wrapt

from apexlite import amp
from apexlite.amp.o1.function_wrappers import O1BoundMethod
from apexlite.amp.o1.patches import applicable_entries
from apexlite.amp.o1.patcher import resolve
from apexlite.amp.session import current_session
from tests.amp.o1 import registered_ops, spawn_receiver

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

ROOT = Path(__file__).resolve().parents[3]
PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)
REGISTERED = [(registered_ops, "scaled_product"), (torch, "sigmoid")]


@pytest.fixture
def o1():
    """An O1 session with two user registrations; yields every (target, name) its O1 patcher replaced."""
    amp.register_half_function(registered_ops, "scaled_product")
    amp.register_float_function(torch, "sigmoid")
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    try:
        yield current_session().o1_patcher.patched_attributes()
    finally:
        amp.deinitialize()


def stored(target, name):
    """What the patch target holds: a class's own attribute (not a bound read), a module's attribute."""
    return inspect.getattr_static(target, name) if isinstance(target, type) else getattr(target, name)


def installed(function):
    """The stored object a value stands for: a patched method read from its class binds its class's wrapper."""
    return function._self_parent if isinstance(function, O1BoundMethod) else function


def test_the_walk_covers_the_whole_patch_table(o1):
    walked = {(id(target), name) for target, name in o1}
    entries = [e for e in applicable_entries() if hasattr(resolve(e.namespace), e.name)]
    assert len(entries) > 150
    missing = [e.qualname for e in entries if (id(resolve(e.namespace)), e.name) not in walked]
    assert not missing
    for target, name in REGISTERED + [(torch.nn.RNNBase, "check_input"), (torch.jit, "script"),
                                      (torch.jit, "trace"), (torch.Tensor, "mm"), (F, "binary_cross_entropy")]:
        assert (id(target), name) in walked, name


def test_every_patched_function_pickles_and_copies_as_itself(o1):
    for target, name in o1:
        patch = stored(target, name)
        label = f"{getattr(target, '__name__', target)}.{name}"
        for protocol in PROTOCOLS:
            assert pickle.loads(pickle.dumps(patch, protocol)) is patch, (label, protocol)
        assert copy.copy(patch) is patch and copy.deepcopy(patch) is patch, label
        if not isinstance(target, type):
            continue
        read = getattr(target, name)  # torch.Tensor.mm: a fresh binding of the class's wrapper each read
        assert installed(read) is patch, label
        for protocol in PROTOCOLS:
            assert installed(pickle.loads(pickle.dumps(read, protocol))) is patch, (label, protocol)
        assert copy.copy(read) is read and copy.deepcopy(read) is read, label


def test_the_issues_functions_round_trip_to_the_patches(o1):
    for function in (torch.mm, torch.matmul, F.linear, F.binary_cross_entropy, registered_ops.scaled_product):
        assert pickle.loads(pickle.dumps(function)) is function
    assert torch.mm is not torch._C._VariableFunctions.mm
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    assert pickle.loads(pickle.dumps(torch.mm))(a, b).dtype is torch.float16
    assert pickle.loads(pickle.dumps(torch.Tensor.mm))(a, b).dtype is torch.float16
    assert pickle.loads(pickle.dumps(registered_ops.scaled_product))(a, b).dtype is torch.float16
    assert pickle.loads(pickle.dumps(torch.sigmoid))(a.half()).dtype is torch.float32
    with pytest.raises(NotImplementedError, match="binary_cross_entropy"):
        pickle.loads(pickle.dumps(F.binary_cross_entropy))(a.half().sigmoid(), b.half().sigmoid())


def test_methods_bound_to_a_tensor_pickle_and_copy_as_plain_torch_does(o1):
    tensor = torch.randn(2, 2)
    other = torch.randn(2, 2)
    for name in ("mm", "matmul", "__matmul__", "norm", "cpu"):
        method = getattr(tensor, name)
        assert isinstance(method, O1BoundMethod), name
        for protocol in PROTOCOLS:
            loaded = pickle.loads(pickle.dumps(method, protocol))
            assert isinstance(loaded, O1BoundMethod) and torch.equal(loaded.__self__, tensor), name
        assert copy.copy(method) is method, name
    assert pickle.loads(pickle.dumps(tensor.mm))(other).dtype is torch.float16
    # deepcopy: a builtin method is itself (as in plain torch), a Python one binds to a copy of the tensor
    assert copy.deepcopy(tensor.mm) is not None and copy.deepcopy(tensor.mm).__self__ is tensor
    copied = copy.deepcopy(tensor.norm)
    assert isinstance(copied, O1BoundMethod) and copied.__self__ is not tensor
    assert torch.equal(copied.__self__, tensor)


def test_the_pickles_name_no_apexlite_and_a_fresh_process_loads_the_originals(o1):
    reads = [(target, name) for target, name in o1 if isinstance(target, type)]
    payload = pickle.dumps([stored(target, name) for target, name in o1] +
                           [getattr(target, name) for target, name in reads])
    assert b"apexlite" not in payload
    names = [(getattr(t, "__module__", None) if isinstance(t, type) else t.__name__,
              t.__qualname__ if isinstance(t, type) else None, n) for t, n in o1]
    names += [(t.__module__, t.__qualname__, n) for t, n in reads]
    check = (
        "import inspect, pickle, sys\n"
        "from importlib import import_module\n"
        "functions, names, raw_count = pickle.loads(sys.stdin.buffer.read())\n"
        "bad = []\n"
        "for index, (function, (module, qualname, name)) in enumerate(zip(functions, names)):\n"
        "    owner = import_module(module)\n"
        "    for part in (qualname.split('.') if qualname else ()):\n"
        "        owner = getattr(owner, part)\n"
        "    raw = index < raw_count\n"
        "    expected = inspect.getattr_static(owner, name) if raw and isinstance(owner, type) else getattr(owner, name)\n"
        "    if function is not expected:\n"
        "        bad.append(name)\n"
        "assert 'apexlite' not in sys.modules\n"
        "print(len(functions), len(bad), bad)\n"
    )
    data = pickle.dumps((pickle.loads(payload), names, len(o1)))  # the same functions, pickled the same way
    result = subprocess.run([sys.executable, "-c", check], input=data, capture_output=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert result.stdout.decode().split(" ", 1)[1].strip() == "0 []"


def test_after_deinitialize_pickles_give_torchs_originals():
    originals = {"mm": torch.mm, "linear": F.linear, "Tensor.mm": inspect.getattr_static(torch.Tensor, "mm")}
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    try:
        under_o1 = pickle.dumps([torch.mm, F.linear, inspect.getattr_static(torch.Tensor, "mm")])
        assert torch.mm is not originals["mm"]
    finally:
        amp.deinitialize()
    assert all(a is b for a, b in zip(pickle.loads(under_o1), originals.values()))
    assert pickle.loads(pickle.dumps(torch.mm)) is originals["mm"] is torch._C._VariableFunctions.mm
    assert pickle.loads(pickle.dumps(torch.Tensor.mm)) is originals["Tensor.mm"]


class Foreign:
    """A class another library patched with wrapt: its wrappers are none of O1's business."""

    def method(self):
        return 1


Foreign.method = wrapt.FunctionWrapper(Foreign.method, lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))


def test_other_wrapt_wrappers_and_the_copyreg_table_are_left_alone():
    table = dict(copyreg.dispatch_table)
    with pytest.raises(NotImplementedError, match="__reduce") as before:
        pickle.dumps(Foreign().method)
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    try:
        assert dict(copyreg.dispatch_table) == table
        with pytest.raises(NotImplementedError) as under_o1:
            pickle.dumps(Foreign().method)
        assert str(under_o1.value) == str(before.value)
    finally:
        amp.deinitialize()


def test_a_transformer_with_a_gelu_activation_builds_under_o1(o1):
    """nn.TransformerEncoder deep-copies its layer, which holds the (patched) F.gelu."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    assert encoder.layers[1].activation is F.gelu
    out = encoder(torch.randn(2, 3, 8))
    assert out.shape == (2, 3, 8) and torch.isfinite(out).all()


@pytest.mark.slow
def test_a_spawn_worker_gets_torchs_functions_then_o1s_once_it_initializes(o1):
    """Functions sent through a queue: before the worker's amp.initialize they load as torch's (fp32
    out), after it as the worker's own patches, casting as this process's O1 does."""
    context = multiprocessing.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    worker = context.Process(target=spawn_receiver.receive, args=(inbox, outbox))
    worker.start()
    try:
        functions = [torch.mm, torch.Tensor.mm, F.linear]
        inbox.put(functions)
        inbox.put(functions)
        without_amp, under_o1 = outbox.get(timeout=300)
    finally:
        worker.join(timeout=60)
        if worker.is_alive():
            worker.kill()
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    here = [str(function(a, b).dtype) for function in functions]
    assert here == ["torch.float16"] * 3
    assert without_amp == ([True] * 3, ["torch.float32"] * 3)
    assert under_o1 == ([True] * 3, here)
    assert worker.exitcode == 0


@pytest.mark.slow
def test_a_spawn_dataloader_with_torch_stack_as_collate_fn(o1):
    samples = [torch.randn(3) for _ in range(4)]
    loader = torch.utils.data.DataLoader(samples, batch_size=2, collate_fn=torch.stack, num_workers=1,
                                         multiprocessing_context="spawn")
    batches = list(loader)
    assert len(batches) == 2
    for index, batch in enumerate(batches):
        assert torch.equal(batch, torch.stack(samples[2 * index: 2 * index + 2]))
