"""apex.fp16_utils against fp32 training and apex's documented behaviour."""
import copy
import io
import logging
import pickle
import sys
import types
from contextlib import contextmanager

import pytest
import torch

from apexlite.compat import apex_aliases
from apexlite.compat.apex import fp16_utils as fu


def _model():
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _data(step):
    gen = torch.Generator().manual_seed(step)
    return torch.randn(16, 6, generator=gen), torch.randn(16, 2, generator=gen)


def test_network_to_half_keeps_batchnorm_fp32_and_prefixes_keys():
    net = fu.network_to_half(_model())
    assert isinstance(net[0], fu.tofp16)
    assert net[1][0].weight.dtype is torch.float16
    assert net[1][1].weight.dtype is torch.float32
    assert "1.0.weight" in net.state_dict()
    assert net(torch.randn(4, 6)).dtype is torch.float16


def test_fp16_model_casts_inputs_and_network():
    model = fu.FP16Model(_model())
    assert fu.FP16_Module is fu.FP16Model
    assert model.network[0].weight.dtype is torch.float16 and model.network[1].weight.dtype is torch.float32
    assert model(torch.randn(4, 6)).dtype is torch.float16


def test_master_param_helpers_round_trip():
    model = _model().half()
    model_params, masters = fu.prep_param_lists(model)
    assert all(m.dtype is torch.float32 and m.requires_grad for m in masters)
    x, y = _data(0)
    torch.nn.functional.mse_loss(model(x.half()).float(), y).backward()
    fu.model_grads_to_master_grads(model_params, masters)
    for p, m in zip(model_params, masters):
        torch.testing.assert_close(m.grad, p.grad.float())
        m.data.add_(1.0)
    fu.master_params_to_model_params(model_params, masters)
    for p, m in zip(model_params, masters):
        torch.testing.assert_close(p.float(), m.detach(), atol=1e-2, rtol=1e-3)
    _, flat = fu.prep_param_lists(model, flat_master=True)
    assert len(flat) == 1 and flat[0].numel() == sum(p.numel() for p in model_params)


def test_to_python_float_and_clip_alias():
    assert fu.to_python_float(torch.tensor(2.5)) == 2.5
    assert fu.to_python_float([3.0]) == 3.0
    assert fu.clip_grad_norm is torch.nn.utils.clip_grad_norm_


def test_fp16_optimizer_tracks_fp32_training():
    torch.manual_seed(0)
    ref = _model()
    half = copy.deepcopy(ref)
    fu.BN_convert_float(half.half())
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt = fu.FP16_Optimizer(torch.optim.SGD(half.parameters(), lr=0.05, momentum=0.9), static_loss_scale=128.0,
                            verbose=False)
    for step in range(5):
        x, y = _data(step)
        opt_ref.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt_ref.step()
        opt.zero_grad()
        opt.backward(torch.nn.functional.mse_loss(half(x.half()).float(), y))
        opt.step()
    for p_half, p_ref in zip(half.parameters(), ref.parameters()):
        torch.testing.assert_close(p_half.float(), p_ref, atol=2e-2, rtol=2e-2)
    masters = opt.state_dict()["fp32_from_fp16"][0]
    assert all(m.dtype is torch.float32 for m in masters)
    assert opt.param_groups[0]["params"][0] is masters[0]


def test_fp16_optimizer_skips_overflow_and_halves_dynamic_scale():
    model = torch.nn.Linear(3, 1).half()
    opt = fu.FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True, verbose=False)
    assert opt.loss_scale == 2.0 ** 16
    before = [p.detach().clone() for p in model.parameters()]
    opt.backward(model(torch.full((2, 3), 1e4, dtype=torch.float16)).float().sum())  # overflows fp16 grads
    assert opt.overflow
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert opt.loss_scale == 2.0 ** 15
    assert opt.clip_master_grads(1.0) == -1


def test_fp16_optimizer_state_dict_round_trip_and_pickle_refusal():
    model = torch.nn.Linear(3, 2).half()
    opt = fu.FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), static_loss_scale=8.0, verbose=False)
    opt.backward(model(torch.randn(4, 3).half()).float().sum())
    opt.step()
    state = opt.state_dict()
    assert set(state) == {"loss_scaler", "dynamic_loss_scale", "overflow", "first_closure_call_this_step",
                          "optimizer_state_dict", "fp32_from_fp16"}
    other_model = torch.nn.Linear(3, 2).half()
    other = fu.FP16_Optimizer(torch.optim.SGD(other_model.parameters(), lr=0.1), verbose=False)
    other.load_state_dict(state)
    assert other.loss_scale == 8.0
    for a, b in zip(other_model.parameters(), model.parameters()):
        torch.testing.assert_close(a, b)
    with pytest.raises(RuntimeError, match="serialized using state_dict"):
        pickle.dumps(opt)


def test_fp16_optimizer_closure_steps():
    model = torch.nn.Linear(3, 1).half()
    opt = fu.FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), static_loss_scale=4.0, verbose=False)
    x = torch.randn(5, 3).half()
    before = model.weight.detach().float().clone()

    def closure():
        opt.zero_grad()
        loss = model(x).float().sum()
        opt.backward(loss)
        return loss

    opt.step(closure)
    torch.testing.assert_close(model.weight.float(), before - 0.1 * x.float().sum(0, keepdim=True),
                               atol=1e-2, rtol=1e-2)


def test_old_standalone_loss_scalers():
    static = fu.LossScaler(4)
    assert static.loss_scale == 4 and not static.has_overflow([])
    dyn = fu.DynamicLossScaler(init_scale=8, scale_factor=2, scale_window=2)
    p = torch.zeros(2, requires_grad=True)
    p.grad = torch.tensor([1.0, float("inf")])
    assert dyn.has_overflow([p])
    dyn.update_scale(True)
    assert dyn.loss_scale == 4
    dyn.update_scale(False)  # one clean iteration since the overflow
    assert dyn.loss_scale == 4
    dyn.update_scale(False)  # second: window reached
    assert dyn.loss_scale == 8
    x = torch.ones(2, requires_grad=True)
    dyn.backward((x * 3).sum())
    torch.testing.assert_close(x.grad, torch.full((2,), 24.0))


# --- apex's rules for the scaler and its checkpoints ----------------------------------------------------------

DYNAMIC_ARGS = [
    ({}, dict(_loss_scale=2.0 ** 16, _scale_seq_len=2000, _max_loss_scale=2.0 ** 24, _min_loss_scale=None)),
    ({"init_scale": 2.0 ** 10, "scale_window": 500}, dict(_loss_scale=2.0 ** 10, _scale_seq_len=500)),
    ({"init_scale": 2.0 ** 32, "max_loss_scale": 2.0 ** 40}, dict(_loss_scale=2.0 ** 32, _max_loss_scale=2.0 ** 40)),
    ({"min_loss_scale": 4.0, "scale_factor": 4.0}, dict(_min_loss_scale=4.0, _scale_factor=4.0)),
]


@pytest.mark.parametrize("args,expected", DYNAMIC_ARGS, ids=str)
def test_dynamic_loss_args_reach_the_scaler(args, expected):
    opt = fu.FP16_Optimizer(torch.optim.SGD(torch.nn.Linear(2, 2).half().parameters(), lr=0.1),
                            dynamic_loss_scale=True, dynamic_loss_args=args, verbose=False)
    assert opt.loss_scaler.dynamic
    for name, value in expected.items():
        assert getattr(opt.loss_scaler, name) == value, name


def test_capped_init_scale_is_logged_and_unknown_keys_refused(caplog):
    params = lambda: torch.nn.Linear(2, 2).half().parameters()  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="apexlite"):
        opt = fu.FP16_Optimizer(torch.optim.SGD(params(), lr=0.1), dynamic_loss_scale=True,
                                dynamic_loss_args={"init_scale": 2.0 ** 32}, verbose=False)
    assert opt.loss_scale == 2.0 ** 24
    assert "init_scale=4.29497e+09 is above max_loss_scale=1.67772e+07" in caplog.text
    with pytest.raises(TypeError, match="unknown keys \\['init_scal'\\]"):
        fu.FP16_Optimizer(torch.optim.SGD(params(), lr=0.1), dynamic_loss_scale=True,
                          dynamic_loss_args={"init_scal": 2.0}, verbose=False)


def test_apex_attribute_names():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3).half(), torch.nn.Linear(3, 1))
    opt = fu.FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), verbose=False)
    assert opt.fp16_groups == [[model[0].weight, model[0].bias]]
    assert opt.fp32_from_fp32_groups[0][0] is model[1].weight
    assert [m.dtype for m in opt.all_fp32_from_fp16_params] == [torch.float32] * 2
    assert opt.param_groups[0]["params"][0] is opt.fp32_from_fp16_groups[0][0]
    assert opt.clip_grad_norm is torch.nn.utils.clip_grad_norm_


# apex's attribute sets (what its __init__ creates), for stand-ins pickled under apex's module paths
APEX_AMP_SCALER = dict(dynamic=True, _loss_scale=2.0 ** 20, _max_loss_scale=2.0 ** 24, _min_loss_scale=None,
                       _scale_seq_len=2000, _unskipped=1999, _has_overflow=False,
                       _overflow_buf=torch.zeros(1, dtype=torch.int))
OLD_DYNAMIC = dict(cur_scale=2.0 ** 20, cur_iter=999, last_overflow_iter=-1, scale_factor=2.0, scale_window=1000)
OLD_STATIC = dict(cur_scale=64.0)
# (module, class, attributes, scale after one clean step, scale after an overflow from there)
APEX_CHECKPOINT_SCALERS = [
    ("apex.amp.scaler", "LossScaler", APEX_AMP_SCALER, 2.0 ** 21, 2.0 ** 20),
    ("apex.fp16_utils.loss_scaler", "DynamicLossScaler", OLD_DYNAMIC, 2.0 ** 21, 2.0 ** 20),
    ("apex.fp16_utils.loss_scaler", "LossScaler", OLD_STATIC, 64.0, 64.0),
]


@contextmanager
def _apex_module(path, name, attributes):
    """A stand-in for apex's module `path` holding a class `name` whose instances carry `attributes`."""
    parts = path.split(".")
    saved = {p: sys.modules.get(p) for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1))}
    cls = type(name, (), {"__module__": path})
    for prefix in saved:
        sys.modules[prefix] = types.ModuleType(prefix)
    setattr(sys.modules[path], name, cls)
    obj = cls()
    obj.__dict__.update(attributes)
    try:
        yield obj
    finally:
        for prefix, module in saved.items():
            if module is None:
                sys.modules.pop(prefix, None)
            else:
                sys.modules[prefix] = module


def _apex_checkpoint(path, name, attributes):
    model = torch.nn.Linear(3, 2).half()
    opt = fu.FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True, verbose=False)
    state = opt.state_dict()
    buffer = io.BytesIO()
    with _apex_module(path, name, attributes) as apex_scaler:
        state["loss_scaler"] = apex_scaler
        torch.save(state, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("path,name,attributes,after_clean,after_overflow", APEX_CHECKPOINT_SCALERS,
                         ids=[f"{p}.{n}" for p, n, *_ in APEX_CHECKPOINT_SCALERS])
def test_apex_written_checkpoints_load_and_train_on(path, name, attributes, after_clean, after_overflow):
    data = _apex_checkpoint(path, name, attributes)
    with apex_aliases():
        state = torch.load(io.BytesIO(data), weights_only=False)
    model = torch.nn.Linear(3, 2).half()
    opt = fu.FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), verbose=False)
    opt.load_state_dict(state)
    saved_scale = attributes["_loss_scale"] if "_loss_scale" in attributes else attributes["cur_scale"]
    assert callable(opt.loss_scaler.loss_scale) and opt.loss_scale == saved_scale
    master = opt.fp32_from_fp16_groups[0][0]
    before = master.detach().clone()
    opt.backward(model(torch.randn(4, 3).half()).float().mean() * 1e-2)  # the step that used to fail
    opt.step()
    assert not opt.overflow and not torch.equal(master, before)
    assert opt.loss_scale == after_clean  # the saved schedule goes on (this step completes a window)
    opt.zero_grad()
    opt.backward(model(torch.full((4, 3), 6e4, dtype=torch.float16)).float().sum())
    opt.step()
    assert opt.overflow and opt.loss_scale == after_overflow


def test_checkpoint_with_an_unknown_scaler_is_refused_at_load():
    model = torch.nn.Linear(3, 2).half()
    opt = fu.FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), verbose=False)
    state = opt.state_dict()
    state["loss_scaler"] = 128.0
    with pytest.raises(TypeError, match="state_dict\\['loss_scaler'\\] is a builtins.float"):
        opt.load_state_dict(state)


def test_apex_scaler_with_an_unusable_scale_is_refused_when_unpickled():
    data = _apex_checkpoint("apex.amp.scaler", "LossScaler", dict(APEX_AMP_SCALER, _loss_scale=float("nan")))
    with apex_aliases(), pytest.raises(RuntimeError, match="loss scale nan"):
        torch.load(io.BytesIO(data), weights_only=False)


def test_master_grads_of_fp32_params_have_their_own_memory():
    """apex copied each model grad into a new master grad: unscaling the master in place must not touch the
    model's grad (an fp32 param, such as an affine batchnorm's after network_to_half)."""
    layer = torch.nn.Linear(4, 3)
    model_params, masters = fu.prep_param_lists(layer)
    layer(torch.randn(2, 4)).sum().backward()
    before = [p.grad.clone() for p in model_params]
    fu.model_grads_to_master_grads(model_params, masters)
    for master in masters:
        master.grad.mul_(1 / 128)
    assert all(torch.equal(p.grad, b) for p, b in zip(model_params, before))


def test_fp16_optimizer_refuses_what_is_not_an_optimizer():
    model = torch.nn.Linear(3, 1).half()
    for wrong in (model, list(model.parameters())):
        with pytest.raises(TypeError, match="wraps a torch.optim optimizer"):
            fu.FP16_Optimizer(wrong)


def test_a_step_after_loss_backward_says_so_instead_of_changing_nothing():
    """loss.backward() leaves the fp32 masters without grads, so apex's step changed nothing, silently."""
    model = torch.nn.Linear(3, 1).half()
    opt = fu.FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), verbose=False)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(2, 3, dtype=torch.float16)).float().sum().backward()
    with pytest.raises(RuntimeError, match=r"optimizer.backward\(loss\) instead of loss.backward\(\)"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad()
    opt.backward(model(torch.ones(2, 3, dtype=torch.float16)).float().sum())  # the right call steps
    opt.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("dynamic, said", [(False, "static loss scale 1048576.0, unchanged"),
                                           (True, "reducing loss scale to 32768.0")])
def test_the_overflow_message_says_what_happened_to_the_scale(caplog, dynamic, said):
    model = torch.nn.Linear(3, 1).half()
    scale = dict(dynamic_loss_scale=True) if dynamic else dict(static_loss_scale=2.0 ** 20)
    opt = fu.FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), verbose=False, **scale)
    opt.backward(model(torch.full((2, 3), 1e4, dtype=torch.float16)).float().sum())
    with caplog.at_level(logging.WARNING):
        opt.step()
    assert opt.overflow and any(said in record.getMessage() for record in caplog.records)
