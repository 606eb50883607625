"""Which weight-decay mode a loaded FusedAdam trains with when its constructor and the checkpoint disagree.

The rule is torch.optim.Adam's, whose mode is a constructor flag as FusedAdam's is: a loaded group takes
the checkpoint's hyper-parameters, ``decoupled_weight_decay`` included, in both directions. So
``FusedAdam(adam_w_mode=m)`` loading a checkpoint must train exactly as ``torch.optim.Adam(
decoupled_weight_decay=m)`` loading the same checkpoint, and say once, naming both modes and the winner,
when the checkpoint's mode overrides the constructor's.
"""
from __future__ import annotations

import inspect
import logging

import pytest
import torch

from apexlite.optimizers import FusedAdam
from tests.optimizers.adam_helpers import IMPLEMENTATIONS, assert_close, fp32_leaves

# the reference is torch's own mode flag, which older torch releases (2.5 among them) do not have: their
# Adam/AdamW checkpoints carry no mode, and FusedAdam keeps its constructor's (test_checkpoint_without_a_mode...)
pytestmark = pytest.mark.skipif("decoupled_weight_decay" not in inspect.signature(torch.optim.Adam).parameters,
                                reason=f"torch {torch.__version__}'s Adam has no decoupled_weight_decay flag")

HYPER = dict(lr=5e-2, weight_decay=0.3)
WARNING = "FusedAdam.load_state_dict"
MODES = {True: "decoupled weight decay (AdamW)", False: "L2 weight decay (Adam)"}


def _grads(step, params):
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(p.shape, generator=gen) for p in params]


def _run(optimizer, params, steps, first=0):
    for step in range(first, first + steps):
        for p, g in zip(params, _grads(step, params)):
            p.grad = g
        optimizer.step()


def _checkpoint(source: str, decoupled: bool, init):
    """A mid-run checkpoint of a torch Adam/AdamW or FusedAdam run in the given mode, and its params."""
    params = fp32_leaves(init)
    if source == "torch":
        optimizer = torch.optim.Adam(params, decoupled_weight_decay=decoupled, foreach=False, **HYPER)
    else:
        optimizer = FusedAdam(params, adam_w_mode=decoupled, **HYPER)
    _run(optimizer, params, 3)
    return optimizer.state_dict(), params


def _warnings(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING and WARNING in r.getMessage()]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("source", ["torch", "fused_adam"])
@pytest.mark.parametrize("saved, built", [(True, False), (False, True), (True, True), (False, False)],
                         ids=["adamw-checkpoint-into-l2", "l2-checkpoint-into-adamw", "both-adamw", "both-l2"])
def test_loaded_mode_follows_torch_adam(implementation, source, saved, built, caplog):
    init = [torch.randn(12), torch.randn(3, 4)]
    checkpoint, at = _checkpoint(source, saved, init)
    ref_params, ours_params = fp32_leaves(at), fp32_leaves(at)
    ref = torch.optim.Adam(ref_params, decoupled_weight_decay=built, foreach=False, **HYPER)
    ref.load_state_dict(checkpoint)
    ours = FusedAdam(ours_params, adam_w_mode=built, implementation=implementation, **HYPER)
    with caplog.at_level(logging.WARNING, logger="apexlite"):
        ours.load_state_dict(checkpoint)
    assert ref.param_groups[0]["decoupled_weight_decay"] is saved  # torch: the checkpoint's mode
    assert ours.param_groups[0]["adam_w_mode"] is saved and ours.adam_w_mode == int(saved)
    _run(ref, ref_params, 10, first=3)
    _run(ours, ours_params, 10, first=3)
    for p, r in zip(ours_params, ref_params):
        assert_close(p, r)
    said = _warnings(caplog)
    if saved == built:
        assert said == []
    else:
        assert len(said) == 1
        message = said[0].getMessage()
        assert f"checkpoint use {MODES[saved]}" in message and f"built with {MODES[built]}" in message
        assert "the checkpoint's mode wins" in message


def test_checkpoint_without_a_mode_keeps_the_constructors():
    checkpoint, at = _checkpoint("torch", True, [torch.randn(5)])
    for group in checkpoint["param_groups"]:  # what torch's AdamW wrote before decoupled_weight_decay existed
        del group["decoupled_weight_decay"]
    for built in (True, False):
        ours = FusedAdam(fp32_leaves(at), adam_w_mode=built, **HYPER)
        ours.load_state_dict(checkpoint)
        assert ours.param_groups[0]["adam_w_mode"] is built


def test_no_warning_where_weight_decay_is_off(caplog):
    checkpoint, at = _checkpoint("torch", True, [torch.randn(5)])
    checkpoint["param_groups"][0]["weight_decay"] = 0.0
    ours = FusedAdam(fp32_leaves(at), adam_w_mode=False, **HYPER)
    with caplog.at_level(logging.WARNING, logger="apexlite"):
        ours.load_state_dict(checkpoint)
    assert ours.param_groups[0]["adam_w_mode"] is True and _warnings(caplog) == []


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("built", [False, True], ids=["into-l2", "into-adamw"])
def test_torch_adamw_checkpoint_trains_as_torch_adamw_resumed(implementation, built, caplog):
    """A torch.optim.AdamW checkpoint: FusedAdam resumes it as AdamW itself does, whatever its own mode."""
    params = fp32_leaves([torch.randn(12), torch.randn(3, 4)])
    source = torch.optim.AdamW(params, foreach=False, **HYPER)
    _run(source, params, 3)
    ref_params, ours_params = fp32_leaves(params), fp32_leaves(params)
    ref = torch.optim.AdamW(ref_params, foreach=False, **HYPER)
    ref.load_state_dict(source.state_dict())
    ours = FusedAdam(ours_params, adam_w_mode=built, implementation=implementation, **HYPER)
    with caplog.at_level(logging.WARNING, logger="apexlite"):
        ours.load_state_dict(source.state_dict())
    assert ours.param_groups[0]["adam_w_mode"] is True
    assert len(_warnings(caplog)) == (0 if built else 1)
    _run(ref, ref_params, 10, first=3)
    _run(ours, ours_params, 10, first=3)
    for p, r in zip(ours_params, ref_params):
        assert_close(p, r)
