"""An O2 checkpoint restored before `amp.initialize` (a common order) never resumes silently wrong.

Reference: the same run uninterrupted. A torch optimizer's O2 checkpoint loaded before initialize has lost
its fp32 masters inside torch's load_state_dict: initialize refuses, naming the right order, and in that
order the resumed run equals the uninterrupted one bit for bit. Masters carried in per-param state
(FusedAdam's format) survive torch's load and are restored at initialize.
"""
import copy

import pytest
import torch

from apexlite import amp
from apexlite.amp.checkpoint_convert import MASTERS_MARKER
from apexlite.amp.errors import AmpUsageError
from apexlite.optimizers import FusedAdam

# (name, optimizer factory): torch optimizers take the separate-masters O2 path
TORCH_OPTIMIZERS = [("adam", lambda params: torch.optim.Adam(params, lr=1e-2)),
                    ("sgd", lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _steps(model, optimizer, count, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        x, y = torch.randn(16, 6, generator=generator), torch.randn(16, 1, generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.half()).float(), y)
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()


def _checkpoint_and_reference(make_optimizer):
    model = _model()
    optimizer = make_optimizer(model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    try:
        _steps(model, optimizer, 3, seed=1)
        checkpoint = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                    "amp": amp.state_dict()})  # as torch.save would: no live tensors
        _steps(model, optimizer, 4, seed=2)
        return checkpoint, [m.detach().clone() for m in amp.master_params(optimizer)]
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("make_optimizer", [o[1] for o in TORCH_OPTIMIZERS], ids=[o[0] for o in TORCH_OPTIMIZERS])
def test_loading_before_initialize_is_refused_and_the_right_order_resumes_exactly(make_optimizer):
    checkpoint, reference = _checkpoint_and_reference(make_optimizer)

    model = _model()
    model.load_state_dict(checkpoint["model"])
    optimizer = make_optimizer(model.parameters())
    optimizer.load_state_dict(checkpoint["optimizer"])
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(AmpUsageError, match=r"amp.initialize\(model, optimizer, \.\.\.\) first, then "
                                            r"optimizer.load_state_dict"):
        amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))  # nothing changed

    model = _model()
    model.load_state_dict(checkpoint["model"])
    optimizer = make_optimizer(model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    try:
        optimizer.load_state_dict(checkpoint["optimizer"])
        amp.load_state_dict(checkpoint["amp"])
        assert not any(MASTERS_MARKER in group for group in optimizer.param_groups)
        _steps(model, optimizer, 4, seed=2)
        for got, want in zip(amp.master_params(optimizer), reference):
            assert torch.equal(got, want)
    finally:
        amp.deinitialize()


def test_removing_the_marker_resumes_from_the_model_weights_as_the_message_says():
    checkpoint, _ = _checkpoint_and_reference(TORCH_OPTIMIZERS[0][1])
    model = _model()
    model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    optimizer.load_state_dict(checkpoint["optimizer"])
    for group in optimizer.param_groups:
        group.pop(MASTERS_MARKER, None)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    try:
        halves = [p for p in model.parameters()]
        for master, half in zip(amp.master_params(optimizer), halves):
            assert torch.equal(master, half.float())  # rebuilt from the model, as apex did
    finally:
        amp.deinitialize()


def test_masters_in_per_param_state_survive_torch_load_and_are_restored_at_initialize():
    """Switching from FusedAdam to torch's Adam: FusedAdam's O2 checkpoint keeps `master_param` per param."""
    model = _model()
    optimizer = FusedAdam(model.parameters(), lr=1e-2)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    try:
        _steps(model, optimizer, 3, seed=1)
        saved = copy.deepcopy(optimizer.state_dict())
        masters = [m.detach().clone() for m in amp.master_params(optimizer)]
    finally:
        amp.deinitialize()
    assert any("master_param" in entry for entry in saved["state"].values())

    fresh = _model()
    adam = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    adam.load_state_dict(saved)  # before initialize: torch keeps per-param state, fp32 while the model is
    fresh, adam = amp.initialize(fresh, adam, opt_level="O2", verbosity=0)
    try:
        restored = list(amp.master_params(adam))
        for got, want in zip(restored, masters):
            assert torch.equal(got, want)
        for model_param, master in zip(fresh.parameters(), restored):
            assert torch.equal(model_param, master.half())  # the model follows its restored masters
        assert all("master_param" not in state for state in adam.state.values())
    finally:
        amp.deinitialize()
