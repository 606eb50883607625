"""apex.amp's internal modules that code reaches into: _initialize, utils, compat, rnn_compat, frontend's levels."""
import importlib
import logging
from collections import OrderedDict, namedtuple

import pytest
import torch

from apexlite.amp.errors import AmpUsageError
from apexlite.amp.opt_levels import Properties, defaults_for
from apexlite.compat import apex_aliases
import apexlite.compat.apex.amp as compat_amp
from apexlite.compat.apex.amp import _initialize, compat, frontend, rnn_compat, utils

Pair = namedtuple("Pair", "a b")


class Batch:
    """A custom batch type with its own `.to`, as apex's applier supported."""

    def __init__(self, tensor):
        self.tensor = tensor

    def to(self, dtype):
        return Batch(self.tensor.to(dtype))


def test_applier_casts_every_tensor_and_leaves_the_rest():
    half = lambda t: t.to(torch.float16)  # noqa: E731
    value = {"x": torch.ones(2), "ids": [torch.arange(3), ("text", 1.5)], "pair": Pair(torch.ones(1), None),
             "batch": Batch(torch.ones(2))}
    out = _initialize.applier(value, half)
    assert type(out) is dict and out["x"].dtype == torch.float16
    assert out["ids"][0].dtype == torch.float16  # apex cast every tensor through fn (to_type skips ints)
    assert out["ids"][1] == ("text", 1.5) and isinstance(out["ids"], list)
    assert type(out["pair"]) is Pair and out["pair"].a.dtype == torch.float16 and out["pair"].b is None
    assert out["batch"].tensor.dtype == torch.float16
    assert _initialize.applier("a string", half) == "a string"
    ordered = _initialize.applier(OrderedDict(a=torch.ones(1)), half)
    assert type(ordered) is dict  # apex rebuilt mappings as dicts


def test_applier_leaves_numpy_arrays_alone():
    numpy = pytest.importorskip("numpy")
    array = numpy.ones(3)
    assert _initialize.applier([array], lambda t: t.half())[0] is array


def test_to_type_casts_floating_tensors_and_custom_batches_only():
    assert _initialize.to_type(torch.float16, torch.ones(2)).dtype == torch.float16
    ints = torch.arange(3)
    assert _initialize.to_type(torch.float16, ints) is ints
    assert _initialize.to_type(torch.float16, Batch(torch.ones(1))).tensor.dtype == torch.float16


def test_o2_state_dict_hook_saves_low_precision_weights_through_fn():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)).half()
    model._register_state_dict_hook(_initialize.O2StateDictHook(lambda t: t.float()))
    state = model.state_dict()
    reference = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    reference.load_state_dict(state)
    for key, value in state.items():
        assert value.dtype == (torch.int64 if "num_batches_tracked" in key else torch.float32), key
        torch.testing.assert_close(value, model.state_dict(keep_vars=False)[key])


def test_checks_raise_apexlites_errors():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(AmpUsageError, match="Parallel wrappers"):
        _initialize.check_models([torch.nn.DataParallel(model)])
    _initialize.check_models([model])

    class FP16_Optimizer:  # noqa: N801 -- the name apex checked for
        param_groups, step = [], None

    with pytest.raises(AmpUsageError, match="FP16_Optimizer"):
        _initialize.check_optimizers([FP16_Optimizer()])
    with apex_aliases():
        from apex import amp

        amp.initialize(model, opt_level="O0", verbosity=0)
        try:
            _initialize.check_params_fp32([torch.nn.Linear(2, 2)])
            with pytest.raises(AmpUsageError, match="expects an fp32 model"):
                _initialize.check_params_fp32([torch.nn.Linear(2, 2).half()])
        finally:
            amp.deinitialize()


def test_replacing_applier_is_logged_as_having_no_effect(caplog):
    original = _initialize.applier
    try:
        with caplog.at_level(logging.WARNING, logger="apexlite"):
            _initialize.applier = lambda value, fn: value
        assert "has no effect" in caplog.text
    finally:
        _initialize.applier = original


@pytest.mark.parametrize("value,expected", [
    (torch.ones(1), True), (torch.ones(1).half(), True), (torch.ones(1, dtype=torch.float64), True),
    (torch.arange(2), False), ([torch.ones(1), (torch.ones(1).half(),)], True), ([torch.ones(1), 3], False),
    (3.0, False), ([], True),
])
def test_is_fp_tensor(value, expected):
    assert utils.is_fp_tensor(value) is expected


def test_cast_helpers():
    x = torch.ones(2)
    half = utils.maybe_half(x)
    assert half.dtype == torch.float16 and utils.maybe_half(half) is half
    assert utils.maybe_float(half).dtype == torch.float32 and utils.maybe_float(x) is x
    pair = utils.maybe_half((x, x))
    assert isinstance(pair, tuple) and {t.dtype for t in pair} == {torch.float16}
    assert utils.type_string(x) == "FloatTensor" and utils.type_string(half) == "HalfTensor"
    assert utils.should_cache(torch.nn.Parameter(x)) and not utils.should_cache(x)
    assert not utils.should_cache(torch.nn.Parameter(half))
    assert utils.collect_fp_tensor_types((x, [half], torch.arange(2)), {"k": x}) == {"FloatTensor", "HalfTensor"}
    kwargs = {"w": x, "n": 3}
    args = utils.casted_args(utils.maybe_half, (x, 3), kwargs)
    assert args[0].dtype == torch.float16 and args[1] == 3 and kwargs["w"].dtype == torch.float16
    cache = {}
    assert utils.cached_cast(utils.maybe_half, x, cache) is cache[x]
    assert utils.verbosify(utils.maybe_half, "mm", False) is utils.maybe_half
    assert utils.verbosify(utils.maybe_half, "mm", True).keywords == {"name": "mm", "verbose": True}
    assert list(utils.as_inplace(["exp", "log"])) == ["exp_", "log_"]


def test_func_helpers_work_on_modules_and_dicts():
    table = {"f": len}
    assert utils.has_func(table, "f") and not utils.has_func(table, "g") and utils.get_func(table, "f") is len
    utils.set_func(table, "g", abs)
    assert table["g"] is abs
    holder = type("Holder", (), {})()
    utils.set_func(holder, "f", len)
    assert utils.has_func(holder, "f") and utils.get_func(holder, "f") is len


def test_cuda_version_helpers_follow_torch():
    assert utils.is_cuda_enabled() == (torch.version.cuda is not None)
    if torch.version.cuda is None:
        with pytest.raises(RuntimeError, match="CPU build"):
            utils.get_cuda_version()
    else:
        assert utils.get_cuda_version()[:2] == tuple(int(p) for p in torch.version.cuda.split(".")[:2])


def test_compat_answers_for_modern_torch():
    assert compat.variable_is_tensor() is True
    assert compat.tensor_is_variable() is False and compat.tensor_is_float_tensor() is False
    assert compat.is_tensor_like(torch.ones(1)) and not compat.is_tensor_like([1.0])
    assert compat.is_floating_point(torch.ones(1)) and not compat.is_floating_point(torch.arange(1))
    assert compat.scalar_python_val(torch.tensor([2.5])) == 2.5 and compat.scalar_python_val([7]) == 7
    assert compat.filter_attrs(torch, ["mm", "no_such_op", "bmm"]) == ["mm", "bmm"]


def test_rnn_compat_and_version(monkeypatch):
    assert rnn_compat.has_old_rnns() is False
    assert rnn_compat.RNN_NAMES == ["rnn_relu", "rnn_tanh", "gru", "lstm"]
    assert compat_amp.__version__ == "0.1.0" and compat_amp.VERSION == (0, 1, 0)
    monkeypatch.setattr(compat_amp, "__version__", compat_amp.__version__)  # importing the submodule rebinds it
    version_module = importlib.import_module("apexlite.compat.apex.amp.__version__")
    assert version_module.VERSION == (0, 1, 0) and version_module.__version__ == "0.1.0"


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_opt_level_classes_set_their_defaults(level):
    cls = getattr(frontend, level)
    assert isinstance(cls, type) and isinstance(frontend.opt_levels[level], cls)
    assert cls.brief.startswith(f"{level}:")
    properties = Properties()
    assert frontend.opt_levels[level](properties) is properties
    assert properties.items() == defaults_for(level, torch.float16).items()


def test_opt_properties_options_reads_like_apexs_dict_and_refuses_writes():
    with apex_aliases():
        from apex import amp

        model = torch.nn.Linear(2, 2)
        amp.initialize(model, opt_level="O2", verbosity=0)
        try:
            options = amp._amp_state.opt_properties.options
            assert options["cast_model_type"] is torch.float16 and options["opt_level"] == "O2"
            with pytest.raises(TypeError):
                options["loss_scale"] = 1.0
        finally:
            amp.deinitialize()
