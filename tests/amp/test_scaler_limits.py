"""Probe: scaling edge cases that used to write NaN or fail with a bare conversion error.

- ~144 overflows in a row (no min_loss_scale) drove the dynamic scale below the float32 range; the
  next clean O2+FusedAdam step then wrote NaN into weights and masters, and O1 raised a bare error.
- A loss that is NaN on every step ran into that at step 144 instead of a clear error.
- `delay_overflow_check=True` with a plain optimizer let an inf step write non-finite params.
- An O2 optimizer checkpoint loaded into a run without masters lost the masters or failed late.
"""
import copy

import pytest
import torch

from apexlite import amp
from apexlite.amp.errors import NonFiniteLossError
from apexlite.amp.scaler import SCALE_FLOOR
from apexlite.amp.session import current_session


def build(opt_level, fused=False, **init):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    if fused:
        from apexlite.optimizers import FusedAdam

        opt = FusedAdam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return amp.initialize(model, opt, opt_level=opt_level, **{"verbosity": 0, **init})


def step(model, opt, x, poison_grad=False, poison_loss=False, **scale_kwargs):
    loss = model(x).float().pow(2).mean()
    if poison_loss:
        loss = loss * float("nan")
    with amp.scale_loss(loss, opt, **scale_kwargs) as scaled:
        scaled.backward()
        if poison_grad:
            next(iter(model.parameters())).grad.view(-1)[0] = float("inf")
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("opt_level,fused", [("O1", False), ("O2", False), ("O2", True)], ids=str)
def test_many_overflows_in_a_row_floor_the_scale_and_a_clean_step_stays_finite(opt_level, fused):
    model, opt = build(opt_level, fused)
    try:
        x = torch.randn(3, 4)
        for _ in range(200):  # far past the ~144 halvings that once left float32
            step(model, opt, x, poison_grad=True)
        scale = current_session().loss_scalers[0].loss_scale()
        assert scale == SCALE_FLOOR
        applied = current_session().stats.steps
        step(model, opt, x)  # clean step at the floor scale: applied (fp16 grads this small mostly underflow)
        assert current_session().stats.steps == applied + 1
        params = list(model.parameters()) + list(amp.master_params(opt))
        assert all(torch.isfinite(p).all() for p in params)
    finally:
        amp.deinitialize()


def test_overflows_at_the_floor_say_so_instead_of_reducing(caplog):
    """apex's message says the scale is reduced; at apexlite's floor it no longer is, and the message says that."""
    model, opt = build("O1", verbosity=1)
    try:
        x = torch.randn(3, 4)
        with caplog.at_level("INFO", logger="apexlite.amp"):
            for _ in range(200):
                step(model, opt, x, poison_grad=True)
        messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Gradient overflow.")]
        assert len(messages) == 200
        assert messages[0] == "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0"
        floor = [m for m in messages if "is at its floor" in m]
        assert floor and all(m.startswith(f"Gradient overflow.  Skipping step, loss scaler 0 is at its floor "
                                          f"{SCALE_FLOOR}") for m in floor)
        assert not any(f"reducing loss scale to {SCALE_FLOOR}" in m for m in messages)
    finally:
        amp.deinitialize()


def test_a_loss_that_is_always_nan_stops_with_a_clear_error_at_the_limit():
    model, opt = build("O1", max_nonfinite_losses=30)
    try:
        x = torch.randn(3, 4)
        weights = [p.detach().clone() for p in model.parameters()]
        for _ in range(29):
            step(model, opt, x, poison_loss=True)
        with pytest.raises(NonFiniteLossError, match="the loss itself was inf/NaN in 30 consecutive"):
            step(model, opt, x, poison_loss=True)
        assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))  # every step was skipped
        assert current_session().loss_scalers[0].loss_scale() >= SCALE_FLOOR
    finally:
        amp.deinitialize()


def test_the_nonfinite_loss_count_restarts_after_a_finite_loss():
    model, opt = build("O1", max_nonfinite_losses=5)
    try:
        x = torch.randn(3, 4)
        for _ in range(4):
            step(model, opt, x, poison_loss=True)
        step(model, opt, x, poison_grad=True)  # an overflow with a finite loss
        for _ in range(4):
            step(model, opt, x, poison_loss=True)
        step(model, opt, x)
    finally:
        amp.deinitialize()


def test_max_nonfinite_losses_zero_never_stops_and_bad_values_are_refused():
    model, opt = build("O1", max_nonfinite_losses=0)
    try:
        for _ in range(10):
            step(model, opt, torch.randn(3, 4), poison_loss=True)
    finally:
        amp.deinitialize()
    with pytest.raises(RuntimeError, match="max_nonfinite_losses"):
        build("O1", max_nonfinite_losses=-1)


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_delay_overflow_check_never_lets_an_inf_step_through(opt_level):
    model, opt = build(opt_level)
    try:
        x = torch.randn(3, 4)
        before = [p.detach().clone() for p in model.parameters()]
        step(model, opt, x, poison_grad=True, delay_overflow_check=True)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert current_session().loss_scalers[0].loss_scale() == 2.0 ** 15
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("saved_with", ["separate_masters", "fused_adam"])
def test_an_o2_checkpoint_loaded_into_o1_puts_the_masters_into_the_params(saved_with):
    from apexlite.optimizers import FusedAdam

    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    target = copy.deepcopy(source)
    source_opt = (FusedAdam if saved_with == "fused_adam" else torch.optim.Adam)(source.parameters(), lr=1e-2)
    source, source_opt = amp.initialize(source, source_opt, opt_level="O2", verbosity=0)
    for _ in range(3):
        step(source, source_opt, torch.randn(5, 4))
    masters = [m.detach().clone() for m in amp.master_params(source_opt)]
    checkpoint = copy.deepcopy(source_opt.state_dict())
    model_state = copy.deepcopy(source.state_dict())
    amp.deinitialize()

    target_opt = torch.optim.Adam(target.parameters(), lr=1e-2)
    target, target_opt = amp.initialize(target, target_opt, opt_level="O1", verbosity=0)
    try:
        target.load_state_dict(model_state)  # fp32 copies of the fp16 weights: rounded
        target_opt.load_state_dict(checkpoint)
        for param, master in zip(target.parameters(), masters):
            assert torch.equal(param.detach(), master)  # the exact fp32 masters, not the rounded copies
        step(target, target_opt, torch.randn(5, 4))
    finally:
        amp.deinitialize()


def test_an_o2_checkpoint_that_matches_no_param_layout_is_refused_with_the_levels_named():
    from apexlite.amp.checkpoint_convert import MASTERS_KEY

    model, opt = build("O1")
    try:
        state = opt.state_dict()
        state[MASTERS_KEY] = [torch.zeros(3, 3)]
        with pytest.raises(RuntimeError, match="saved under O2.*O0/O1/O3"):
            opt.load_state_dict(state)
    finally:
        amp.deinitialize()
