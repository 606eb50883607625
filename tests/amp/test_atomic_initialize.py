"""Probe: a failed `initialize` or a rejected checkpoint leaves models, optimizers and torch as they were.

Before, an O2 initialize that failed part-way (the same optimizer twice) left the model in fp16 and
the optimizer's state changed, so the corrected retry failed too; a mismatched O2 optimizer checkpoint
half-replaced the live state before being rejected; `amp.load_state_dict` accepted -5.0 and NaN.
"""
import copy
import math

import pytest
import torch

from apexlite import amp
from apexlite.amp.errors import AmpConfigError, AmpUsageError
from apexlite.amp.session import current_session
from tests._helpers.torch_snapshot import snapshot_patch_targets, unchanged_since


def build(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss = model(torch.randn(6, 4)).pow(2).mean()  # give the optimizer state before initialize
    loss.backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def fingerprint(model, opt):
    """Everything a failed initialize must leave alone."""
    return {
        "tensors": {name: (t.dtype, t.detach().clone()) for name, t in model.state_dict(keep_vars=True).items()},
        "hooks": (len(model._forward_hooks), len(model._forward_pre_hooks)),
        "groups": [[id(p) for p in g["params"]] for g in opt.param_groups],
        "state": {id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                  for p, s in opt.state.items()},
        "attrs": sorted(vars(opt)),
    }


def assert_same(before, after):
    assert before["hooks"] == after["hooks"] and before["groups"] == after["groups"]
    assert before["attrs"] == after["attrs"]
    assert before["tensors"].keys() == after["tensors"].keys()
    for key, (dtype, value) in before["tensors"].items():
        assert after["tensors"][key][0] is dtype and torch.equal(after["tensors"][key][1], value), key
    assert before["state"].keys() == after["state"].keys()
    for pid, state in before["state"].items():
        for name, value in state.items():
            other = after["state"][pid][name]
            assert torch.equal(other, value) if torch.is_tensor(value) else other == value


def test_same_optimizer_twice_is_rejected_before_anything_changes_and_the_retry_works():
    model, opt = build()
    before, patched_before = fingerprint(model, opt), snapshot_patch_targets()
    with pytest.raises(AmpUsageError, match="only be passed through amp.initialize once"):
        amp.initialize(model, [opt, opt], opt_level="O2", verbosity=0)
    assert_same(before, fingerprint(model, opt))
    assert unchanged_since(patched_before) and current_session(required=False) is None
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)  # the corrected retry
    try:
        assert model[0].weight.dtype is torch.float16 and model[1].weight.dtype is torch.float32
    finally:
        amp.deinitialize()


class FailingMasters(Exception):
    pass


@pytest.mark.parametrize("opt_level", ["O1", "O2", "O3"])
def test_a_failure_after_the_casts_rolls_everything_back(opt_level, monkeypatch):
    """A late failure (here: the second optimizer's setup) undoes casts, hooks, state and patches."""
    from apexlite.amp import frontend

    model, opt = build()
    other, _ = build(seed=1)
    second = torch.optim.SGD(other.parameters(), lr=0.1)
    before, second_before = fingerprint(model, opt), fingerprint(other, second)
    patched_before = snapshot_patch_targets()
    real = frontend._grad_strategy

    def failing(session, optimizer, *args):
        if optimizer is second:
            raise FailingMasters("injected")
        return real(session, optimizer, *args)

    monkeypatch.setattr(frontend, "_grad_strategy", failing)
    with pytest.raises(FailingMasters):
        amp.initialize([model, other], [opt, second], opt_level=opt_level, verbosity=0)
    assert_same(before, fingerprint(model, opt))
    assert_same(second_before, fingerprint(other, second))
    assert unchanged_since(patched_before) and current_session(required=False) is None
    monkeypatch.setattr(frontend, "_grad_strategy", real)
    amp.initialize([model, other], [opt, second], opt_level=opt_level, verbosity=0)
    amp.deinitialize()


def test_a_failed_second_initialize_leaves_the_first_session_working(monkeypatch):
    from apexlite.amp import frontend

    model, opt = build()
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    try:
        session = current_session()
        scalers, options = list(session.loss_scalers), session.options
        other, other_opt = build(seed=1)
        patched_before = snapshot_patch_targets()
        monkeypatch.setattr(frontend, "_grad_strategy", lambda *a: (_ for _ in ()).throw(FailingMasters()))
        with pytest.raises(FailingMasters):
            amp.initialize(other, other_opt, opt_level="O1", verbosity=0)
        assert current_session() is session and session.loss_scalers == scalers and session.options is options
        assert other[0].weight.dtype is torch.float32 and not hasattr(other_opt, "_amp_stash")
        assert unchanged_since(patched_before)  # the O1 call patched nothing that stayed
        assert not session.cast_state.active
        with amp.scale_loss(model(torch.randn(6, 4)).float().sum(), opt) as scaled:
            scaled.backward()
        opt.step()
    finally:
        amp.deinitialize()


def test_pending_registrations_survive_a_failed_initialize(monkeypatch):
    from apexlite.amp import frontend

    def custom(x):
        return x * 2

    holder = type("Holder", (), {"custom": staticmethod(custom)})
    amp.register_half_function(holder, "custom")
    model, opt = build()
    monkeypatch.setattr(frontend, "_grad_strategy", lambda *a: (_ for _ in ()).throw(FailingMasters()))
    with pytest.raises(FailingMasters):
        amp.initialize(model, opt, opt_level="O1", verbosity=0)
    monkeypatch.undo()
    amp.initialize(model, opt, opt_level="O1", verbosity=0)
    try:
        assert holder.custom(torch.ones(2)).dtype is torch.float16
    finally:
        amp.deinitialize()


# --- optimizer.load_state_dict: validate first, then apply ---------------------------------------

def o2_trained(seed, width=8):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt


@pytest.mark.parametrize("kind", ["torch_adam", "fused_adam"])
def test_mismatched_o2_checkpoint_leaves_live_state_untouched(kind):
    from apexlite.optimizers import FusedAdam

    source, source_opt = o2_trained(0)
    if kind == "fused_adam":
        source_opt = FusedAdam(source.parameters(), lr=1e-2)
    source, source_opt = amp.initialize(source, source_opt, opt_level="O2", verbosity=0)
    with amp.scale_loss(source(torch.randn(3, 4)).float().sum(), source_opt) as scaled:
        scaled.backward()
    source_opt.step()
    checkpoint = copy.deepcopy(source_opt.state_dict())
    amp.deinitialize()

    model, opt = o2_trained(1)
    if kind == "fused_adam":
        opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    try:
        with amp.scale_loss(model(torch.randn(3, 4)).float().sum(), opt) as scaled:
            scaled.backward()
        opt.step()
        live = copy.deepcopy(opt.state_dict())
        weights = [p.detach().clone() for p in model.parameters()]
        from apexlite.amp.checkpoint_convert import MASTERS_KEY

        broken = copy.deepcopy(checkpoint)
        if MASTERS_KEY in broken:
            broken[MASTERS_KEY] = broken[MASTERS_KEY][:-1]  # one master short
        else:
            first = next(iter(broken["state"].values()))
            first["master_param"] = first["master_param"][:1]  # a master of the wrong shape
        with pytest.raises((AmpUsageError, RuntimeError, ValueError)):
            opt.load_state_dict(broken)
        after = opt.state_dict()
        for pid, state in live["state"].items():
            for key, value in state.items():
                if torch.is_tensor(value):
                    assert torch.equal(after["state"][pid][key], value), key
        for a, b in zip(weights, model.parameters()):
            assert torch.equal(a, b)
    finally:
        amp.deinitialize()


# --- amp.load_state_dict (issue 10 item 8) -------------------------------------------------------

BAD_AMP_STATES = [
    ({"loss_scaler0": {"loss_scale": -5.0, "unskipped": 0}}, "finite number > 0"),
    ({"loss_scaler0": {"loss_scale": math.nan, "unskipped": 0}}, "finite number > 0"),
    ({"loss_scaler0": {"loss_scale": math.inf, "unskipped": 0}}, "finite number > 0"),
    ({"loss_scaler0": {"loss_scale": 0.0, "unskipped": 0}}, "finite number > 0"),
    ({"loss_scaler0": {"loss_scale": 128.0, "unskipped": -1}}, "unskipped must be an int >= 0"),
    ({"loss_scaler0": {"loss_scale": 128.0, "unskipped": 2.5}}, "unskipped must be an int >= 0"),
    ({"loss_scaler0": {"loss_scale": 128.0}}, "lacks unskipped"),
    ({"loss_scaler0": [128.0, 0]}, "must be a dict"),
    ({"loss_scaler0": {"loss_scale": 8.0, "unskipped": 1}, "loss_scaler1": {"loss_scale": -1.0, "unskipped": 0}},
     "finite number > 0"),
    (None, "expects a dict like"),
    ([("loss_scaler0", {"loss_scale": 1.0, "unskipped": 0})], "expects a dict like"),
    ({"scale": 1.0}, "Unexpected key"),
]


@pytest.mark.parametrize("state,needle", BAD_AMP_STATES, ids=lambda v: str(v)[:40])
def test_amp_load_state_dict_rejects_poisonous_state_and_changes_nothing(state, needle):
    model, opt = o2_trained(0)
    amp.initialize(model, opt, opt_level="O1", num_losses=2, verbosity=0)
    try:
        before = amp.state_dict()
        with pytest.raises(AmpConfigError, match=needle) as caught:
            amp.load_state_dict(state)
        assert "loss_scale" in str(caught.value) or "Unexpected" in str(caught.value)  # shows the format
        assert amp.state_dict() == before
    finally:
        amp.deinitialize()


def test_amp_load_state_dict_clamps_above_max_and_maps_partial_dicts_by_key(caplog):
    model, opt = o2_trained(0)
    amp.initialize(model, opt, opt_level="O1", num_losses=3, max_loss_scale=2.0 ** 20, verbosity=0)
    try:
        amp.load_state_dict({"loss_scaler2": {"loss_scale": 2.0 ** 30, "unskipped": 7}})
        state = amp.state_dict()
        assert state["loss_scaler2"] == {"loss_scale": 2.0 ** 20, "unskipped": 7}
        assert state["loss_scaler0"] == {"loss_scale": 2.0 ** 16, "unskipped": 0}  # untouched, not overwritten
        assert "above max_loss_scale" in caplog.text
    finally:
        amp.deinitialize()


# --- smaller hygiene (issue 14 items 5 and 6) --------------------------------------------------

def test_min_loss_scale_above_the_initial_scale_is_an_initialize_error():
    model, opt = o2_trained(0)
    with pytest.raises(AmpConfigError, match="above the initial dynamic loss scale"):
        amp.initialize(model, opt, opt_level="O1", min_loss_scale=2.0 ** 17, verbosity=0)
    assert current_session(required=False) is None


@pytest.mark.parametrize("opt_level", ["O2", "O3"])
def test_float64_model_is_refused_by_casting_levels(opt_level):
    model = torch.nn.Linear(4, 2).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(AmpConfigError, match="float64"):
        amp.initialize(model, opt, opt_level=opt_level, verbosity=0)
    assert model.weight.dtype is torch.float64


@pytest.mark.parametrize("opt_level", ["O0", "O1", "O2", "O3"])
def test_a_model_on_the_meta_device_is_refused_with_how_to_materialise_it(opt_level):
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(AmpUsageError, match=r"0.weight is on the meta device \(shapes without values\).*to_empty"):
        amp.initialize(model, opt, opt_level=opt_level, verbosity=0)
    assert current_session(required=False) is None and model[0].weight.is_meta


def test_float64_model_is_left_alone_by_o1():
    model = torch.nn.Linear(4, 2).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    try:
        x = torch.randn(3, 4, dtype=torch.float64)
        out = model(x)
        assert out.dtype is torch.float64 and torch.equal(out, torch.nn.functional.linear(x, model.weight, model.bias))
    finally:
        amp.deinitialize()


def test_o2_add_param_group_refuses_a_param_already_present():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    try:
        with pytest.raises(ValueError, match="more than one parameter group"):
            opt.add_param_group({"params": [model[0].weight]})
        with pytest.raises(ValueError, match="more than one parameter group"):
            opt.add_param_group({"params": [model[1].weight, model[1].weight]})
        opt.add_param_group({"params": list(model[1].parameters())})
        assert len(opt.param_groups) == 2
    finally:
        amp.deinitialize()
