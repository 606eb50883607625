"""Issue 18 item 6 (the wrapper part): patched functions pickle and copy as the torch functions they stand for.

Each patched callable pickles by reference, with the reference torch's own pickling of the function uses:
a torch builtin reduces to its defining class's attribute (so it loads as the original even in this
process), a Python-level function to its module's (or class's) attribute name. The bytes name only torch
and the standard library: a process that never imported apexlite (a spawn worker) loads the originals.
copy.copy and copy.deepcopy return a patched module function itself, as they do for any function (a
patched Tensor method is read as a fresh wrapt bound wrapper each time, which wrapt still refuses to copy).
"""
import copy
import copyreg
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
from apexlite.amp.o1.lists import op_entries
from apexlite.amp.o1.patcher import raw_attribute, resolve

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

ROOT = Path(__file__).resolve().parents[3]


def _entries():
    """(qualname, namespace object, name, unpatched original) of every table entry on this torch."""
    found = []
    for entry in op_entries():
        target = resolve(entry.namespace)
        if hasattr(target, entry.name):
            found.append((entry.qualname, target, entry.name, raw_attribute(target, entry.name)))
    return found


ENTRIES = _entries()


@pytest.fixture
def o1():
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    yield
    amp.deinitialize()


def _reduces_to_its_owner(original) -> bool:
    """True for torch builtins and method descriptors: their own pickle is getattr(defining class, name)."""
    return not hasattr(original, "__code__") and isinstance(original.__reduce_ex__(4), tuple)


def _unwrap(value):
    """A bound method's function, or the value itself (for comparing what a reference names)."""
    return getattr(value, "__func__", value)


def test_every_patched_function_pickles_as_plain_torch_names_it(o1):
    for qualname, target, name, original in ENTRIES:
        patched = getattr(target, name)
        assert patched is not original and getattr(patched, "__wrapped__", None) is original, qualname
        loaded = pickle.loads(pickle.dumps(patched))
        if _reduces_to_its_owner(original):
            assert loaded is original, qualname  # torch's own reference names the defining object
        else:
            current = getattr(target, name)  # a reference by name loads what the name holds now
            assert _unwrap(getattr(loaded, "__wrapped__", loaded)) is _unwrap(
                getattr(current, "__wrapped__", current)), qualname


def test_torch_stack_round_trips_to_the_original_under_o1(o1):
    original = torch._C._VariableFunctions.stack
    assert torch.stack is not original
    assert pickle.loads(pickle.dumps(torch.stack)) is original
    assert pickle.loads(pickle.dumps(torch.Tensor.mm)) is raw_attribute(torch._C.TensorBase, "mm")


def test_bound_patched_methods_pickle_with_their_tensor(o1):
    tensor = torch.randn(2, 2)
    loaded = pickle.loads(pickle.dumps(tensor.mm))
    assert torch.equal(loaded.__self__, tensor)
    other = torch.randn(2, 2)
    assert torch.equal(loaded(other).float(), tensor.mm(other).float())


def test_the_pickles_name_no_apexlite_and_a_fresh_process_loads_the_originals(o1):
    patched = [getattr(target, name) for _, target, name, _ in ENTRIES]
    payload = pickle.dumps([(qualname, function) for (qualname, *_), function in zip(ENTRIES, patched)])
    assert b"apexlite" not in payload
    check = (
        "import pickle, sys\n"
        "import torch\n"
        "from importlib import import_module\n"
        "bad = []\n"
        "for qualname, function in pickle.loads(sys.stdin.buffer.read()):\n"
        "    namespace, name = qualname.rsplit('.', 1)\n"
        "    parts = namespace.split('.')\n"
        "    owner = import_module(parts[0])\n"
        "    for part in parts[1:]:\n"
        "        owner = getattr(owner, part)\n"
        "    expected = getattr(owner, name)\n"
        "    if getattr(function, '__func__', function) is not getattr(expected, '__func__', expected):\n"
        "        bad.append(qualname)\n"
        "assert 'apexlite' not in sys.modules\n"
        "print(len(bad), bad)\n"
    )
    result = subprocess.run([sys.executable, "-c", check], input=payload, capture_output=True, timeout=240,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert result.stdout.decode().strip() == "0 []"


class Foreign:
    """A class another library patched with wrapt: its bound wrappers are none of O1's business."""

    def method(self):
        return 1


Foreign.method = wrapt.FunctionWrapper(Foreign.method, lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))


def test_the_method_reducer_leaves_other_wrappers_alone_and_leaves_with_the_patches():
    assert wrapt.BoundFunctionWrapper not in copyreg.dispatch_table
    with pytest.raises(NotImplementedError, match="__reduce__") as before:
        pickle.dumps(Foreign().method)
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    try:
        assert wrapt.BoundFunctionWrapper in copyreg.dispatch_table
        with pytest.raises(NotImplementedError) as under_o1:
            pickle.dumps(Foreign().method)
        assert str(under_o1.value) == str(before.value)
    finally:
        amp.deinitialize()
    assert wrapt.BoundFunctionWrapper not in copyreg.dispatch_table


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_copies_of_patched_functions_are_the_functions_themselves(copier, o1):
    functions = [(qualname, target, name) for qualname, target, name, _ in ENTRIES if not isinstance(target, type)]
    assert len(functions) > 100
    for qualname, target, name in functions:
        patched = getattr(target, name)
        assert copier(patched) is patched, qualname
    assert copier([F.gelu, torch.mm])[0] is F.gelu


def test_a_transformer_with_a_gelu_activation_builds_under_o1(o1):
    """nn.TransformerEncoder deep-copies its layer, which holds the (patched) F.gelu."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    assert encoder.layers[1].activation is F.gelu
    out = encoder(torch.randn(2, 3, 8))
    assert out.shape == (2, 3, 8) and torch.isfinite(out).all()


@pytest.mark.slow
def test_a_spawn_dataloader_with_torch_stack_as_collate_fn(o1):
    samples = [torch.randn(3) for _ in range(4)]
    loader = torch.utils.data.DataLoader(samples, batch_size=2, collate_fn=torch.stack, num_workers=1,
                                         multiprocessing_context="spawn")
    batches = list(loader)
    assert len(batches) == 2
    for index, batch in enumerate(batches):
        assert torch.equal(batch, torch.stack(samples[2 * index: 2 * index + 2]))
