"""What apexlite's optimizers share (_base.py): copies (`copy.deepcopy`, pickle) that keep their own
attributes and train on exactly as the original does, and the hyper-parameter checks, for every optimizer."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

from apexlite.optimizers import FusedAdagrad, FusedAdam, FusedLAMB, FusedMixedPrecisionLamb, FusedNovoGrad, FusedSGD

OPTIMIZERS = [
    (FusedAdam, {}), (FusedAdam, {"flat_buffers": False}), (FusedAdam, {"implementation": "torch"}),
    (FusedSGD, {"lr": 0.1, "momentum": 0.9, "set_grad_none": False, "wd_after_momentum": True}),
    (FusedLAMB, {"adam_w_mode": False}), (FusedNovoGrad, {"reg_inside_moment": True}),
    (FusedAdagrad, {"adagrad_w_mode": True}), (FusedMixedPrecisionLamb, {}),
]
IDS = [f"{cls.__name__}{''.join(f'-{k}' for k in kwargs)}" for cls, kwargs in OPTIMIZERS]


def _train(model, optimizer, inputs):
    optimizer.zero_grad()
    model(inputs).pow(2).mean().backward()
    optimizer.step()


def _copy(kind, pair):
    return copy.deepcopy(pair) if kind == "deepcopy" else pickle.loads(pickle.dumps(pair))


@pytest.mark.parametrize("kind", ["deepcopy", "pickle"])
@pytest.mark.parametrize("cls,kwargs", OPTIMIZERS, ids=IDS)
def test_a_copy_keeps_its_attributes_and_trains_on_like_the_original(kind, cls, kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    optimizer = cls(model.parameters(), **kwargs)
    inputs = [torch.randn(5, 4) for _ in range(4)]
    _train(model, optimizer, inputs[0])
    model_copy, optimizer_copy = _copy(kind, (model, optimizer))
    own = {key: value for key, value in vars(optimizer).items()
           if key in ("set_grad_none", "adam_w_mode", "wd_after_momentum", "moment_mode", "adagrad_w_mode",
                      "flat_buffers", "implementation", "reduced_precision_dtype")}
    assert own and {key: getattr(optimizer_copy, key) for key in own} == own
    for batch in inputs[1:]:
        _train(model, optimizer, batch)
        _train(model_copy, optimizer_copy, batch)
    for original, copied in zip(model.parameters(), model_copy.parameters()):
        assert copied.data_ptr() != original.data_ptr()
        assert torch.equal(copied, original)
    assert optimizer_copy.param_groups[0]["params"][0] is next(model_copy.parameters())


HYPER_CASES = [({"lr": -1.0}, "Invalid learning rate"), ({"eps": -1.0}, "Invalid epsilon"),
               ({"betas": (1.5, 0.9)}, "Invalid betas"), ({"betas": (0.9, 1.0)}, "Invalid betas"),
               ({"weight_decay": -0.1}, "Invalid weight_decay")]


@pytest.mark.parametrize("cls", [FusedAdam, FusedLAMB, FusedNovoGrad, FusedMixedPrecisionLamb])
@pytest.mark.parametrize("bad,message", HYPER_CASES)
def test_hyper_parameters_out_of_range_are_refused(cls, bad, message):
    with pytest.raises(ValueError, match=message):
        cls([torch.nn.Parameter(torch.zeros(2))], **bad)


TYPE_CASES = [(FusedSGD, {"lr": "0.1"}), (FusedSGD, {"momentum": "0.9", "lr": 0.1}), (FusedAdagrad, {"lr": "0.1"}),
              (FusedAdagrad, {"eps": None}), (FusedLAMB, {"max_grad_norm": float("nan")}),
              (FusedLAMB, {"max_grad_norm": "1.0"}), (FusedAdam, {"lr": "1e-3"})]


@pytest.mark.parametrize("cls,bad", TYPE_CASES, ids=lambda v: str(v))
def test_a_hyper_parameter_that_is_not_a_number_is_named(cls, bad):
    """A str from a config file gave a bare '<' not supported error; a NaN max_grad_norm a self-contradicting warning."""
    name = next(iter(bad))
    with pytest.raises(TypeError, match=f"takes {name} as a number"):
        cls([torch.nn.Parameter(torch.zeros(2))], **bad)


@pytest.mark.parametrize("cls,reference", [(FusedSGD, torch.optim.SGD), (FusedAdagrad, torch.optim.Adagrad)],
                         ids=["FusedSGD", "FusedAdagrad"])
def test_a_tensor_lr_still_steps_as_torch_does(cls, reference):
    """The type checks above must not refuse a one-element tensor lr (what an lr schedule under torch.compile uses)."""
    stepped = []
    for make in (cls, reference):
        param = torch.nn.Parameter(torch.ones(3))
        optimizer = make([param], lr=torch.tensor(0.1))
        param.grad = torch.tensor([1.0, -2.0, 0.5])
        optimizer.step()
        stepped.append(param.detach().clone())
    torch.testing.assert_close(stepped[0], stepped[1])


@pytest.mark.parametrize("cls,kwargs", OPTIMIZERS, ids=IDS)
def test_a_loaded_state_dict_reads_back_exactly_as_it_was_saved(cls, kwargs):
    """torch's load adds `differentiable` to the defaults and each group; a resumed run's state_dict then
    differed from the uninterrupted run's, which checkpoint comparisons noticed."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = cls(model.parameters(), **kwargs)
    _train(model, optimizer, torch.randn(5, 4))
    saved = optimizer.state_dict()
    loaded = cls(torch.nn.Linear(4, 3).parameters(), **kwargs)
    loaded.load_state_dict(copy.deepcopy(saved))
    assert [sorted(group) for group in loaded.state_dict()["param_groups"]] == \
        [sorted(group) for group in saved["param_groups"]]
    assert sorted(loaded.defaults) == sorted(optimizer.defaults)
