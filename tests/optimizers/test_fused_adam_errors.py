"""Bad configurations and inputs fail early with messages that say what to change."""
from __future__ import annotations

import pytest
import torch

from apexlite.optimizers import FusedAdam

# constructor keyword -> (bad value, exception, message pattern)
BAD_CONSTRUCTOR_ARGS = {
    "negative_lr": (dict(lr=-1e-3), ValueError, "Invalid learning rate"),
    "tensor_lr": (dict(lr=torch.tensor(1e-3)), TypeError, "Python float"),
    "beta1_one": (dict(betas=(1.0, 0.999)), ValueError, "Invalid betas"),
    "beta2_negative": (dict(betas=(0.9, -0.1)), ValueError, "Invalid betas"),
    "three_betas": (dict(betas=(0.9, 0.99, 0.999)), ValueError, "Invalid betas"),
    "str_lr": (dict(lr="1e-3"), TypeError, "takes lr as a number"),
    "str_eps": (dict(eps="1e-8"), TypeError, "takes eps as a number"),
    "float_betas": (dict(betas=0.9), TypeError, "betas as a pair"),
    "str_betas": (dict(betas=("0.9", "0.999")), TypeError, "betas as a pair"),
    "negative_eps": (dict(eps=-1e-8), ValueError, "Invalid epsilon"),
    "negative_weight_decay": (dict(weight_decay=-0.1), ValueError, "Invalid weight_decay"),
    "amsgrad": (dict(amsgrad=True), RuntimeError, "AMSGrad"),
    "fp16_moments": (dict(exp_avg_dtype=torch.float16), ValueError, "exp_avg_dtype"),
    "unknown_implementation": (dict(implementation="cuda"), ValueError, "implementation"),
}

# legacy apex step() keywords -> message pattern
LEGACY_STEP_ARGS = {
    "grads": "no longer takes",
    "output_params": "no longer takes",
    "scale": "no longer takes",
    "grad_norms": "no longer takes",
    "grad_scaler": "scaler.step",
}


def _param(dtype=torch.float32, grad=True):
    p = torch.nn.Parameter(torch.randn(4, dtype=dtype))
    if grad:
        p.grad = torch.randn(4, dtype=dtype)
    return p


@pytest.mark.parametrize("case", sorted(BAD_CONSTRUCTOR_ARGS))
def test_bad_constructor_argument_is_rejected(case):
    kwargs, error, pattern = BAD_CONSTRUCTOR_ARGS[case]
    with pytest.raises(error, match=pattern):
        FusedAdam([_param()], **kwargs)


def test_bad_param_group_hyper_parameter_is_rejected():
    opt = FusedAdam([_param()])
    with pytest.raises(ValueError, match="Invalid learning rate"):
        opt.add_param_group({"params": [_param()], "lr": -1.0})


@pytest.mark.parametrize("name", sorted(LEGACY_STEP_ARGS))
def test_legacy_step_arguments_are_rejected(name):
    opt = FusedAdam([_param()])
    with pytest.raises(RuntimeError, match=LEGACY_STEP_ARGS[name]):
        opt.step(**{name: object()})


def test_unknown_step_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword"):
        FusedAdam([_param()]).step(warmup=True)


def test_sparse_gradient_is_rejected():
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="SparseAdam"):
        FusedAdam(embedding.parameters()).step()


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_unsupported_param_dtype_is_rejected(dtype):
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        FusedAdam([_param(dtype)]).step()


def test_amsgrad_checkpoint_is_rejected():
    p = _param()
    torch_opt = torch.optim.Adam([p], amsgrad=True)
    torch_opt.step()
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedAdam([p]).load_state_dict(torch_opt.state_dict())
