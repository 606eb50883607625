"""amp_C.update_scale_hysteresis: apex's fuzz test (tests/L0/run_amp/test_update_scale_hysteresis.py) on CPU,
plus a step-by-step comparison with a plain-Python model of the rule apex documents."""
import itertools
import math
import random

import pytest
import torch

from apexlite.compat import amp_C

SMALLEST_NORMAL = torch.finfo(torch.float32).tiny
EXTRA_ITERS_MAX = 200  # apex drew up to 1000 extra iterations; 200 keeps the same phases, 5x cheaper on CPU


def _isfinite(val):
    """apex's test helper: a usable fp32 scale is a normal, finite number."""
    return SMALLEST_NORMAL <= val <= torch.finfo(torch.float32).max


def _state(init_scale, hysteresis):
    return (torch.tensor([init_scale], dtype=torch.float32), torch.tensor([0], dtype=torch.int32),
            torch.tensor([hysteresis], dtype=torch.int32))


@pytest.mark.parametrize("init_scale,growth_factor,backoff_factor,growth_interval,hysteresis",
                         list(itertools.product([1, 1024, 65536], [1.0, 2.0, 4.0], [0.5, 0.25], [10, 100], [10, 100])))
def test_apex_fuzz(init_scale, growth_factor, backoff_factor, growth_interval, hysteresis):
    rng = random.Random(init_scale * 7 + growth_interval * 13 + hysteresis)
    scale, growth_tracker, hysteresis_tracker = _state(init_scale, hysteresis)
    args = (growth_factor, backoff_factor, growth_interval, hysteresis)

    def step(found):
        amp_C.update_scale_hysteresis(scale, growth_tracker, hysteresis_tracker, found, *args)

    found_inf = torch.tensor([1], dtype=torch.float32)
    for _ in range(hysteresis - 1):  # infs for hysteresis-1 steps: the scale holds
        step(found_inf)
    assert scale.item() == init_scale

    found_inf.zero_()
    for _ in range(growth_interval - 1):  # clean steps short of the interval: the scale holds
        step(found_inf)
    assert scale.item() == init_scale

    found_inf.fill_(1)  # infs for more than `hysteresis` steps: backed off once per step after that
    extra_iters = rng.randint(0, EXTRA_ITERS_MAX)
    scale_ref = scale.item()
    for _ in range(hysteresis + extra_iters):
        step(found_inf)
    for _ in range(1 + extra_iters):
        scale_new = scale_ref * backoff_factor
        scale_ref = scale_new if _isfinite(scale_new) else 0
    assert scale.item() == scale_ref

    found_inf.fill_(0)  # clean steps: grown every growth_interval steps
    extra_iters = rng.randint(0, EXTRA_ITERS_MAX)
    scale_ref = scale.item()
    for _ in range(growth_interval + extra_iters):
        step(found_inf)
    for _ in range(1 + extra_iters // growth_interval):
        scale_new = scale_ref * growth_factor
        if _isfinite(scale_new):
            scale_ref = scale_new
    assert scale.item() == scale_ref


def _model_step(state, found_inf, growth_factor, backoff_factor, growth_interval, hysteresis):
    """The documented rule, one step, on Python numbers (scale rounded to fp32 as the kernel stores it)."""
    scale, growth, left = state
    if found_inf > 0:
        left -= 1
        if left > 0:
            return scale, 0, left
    if found_inf:
        scale = float(torch.tensor(scale * backoff_factor, dtype=torch.float32))
        scale, growth = (0.0 if abs(scale) < SMALLEST_NORMAL else scale), 0
    elif growth + 1 == growth_interval:
        grown = float(torch.tensor(scale * growth_factor, dtype=torch.float32))
        scale, growth = (grown if math.isfinite(grown) else scale), 0
    else:
        growth += 1
    return scale, growth, (hysteresis if found_inf <= 0 else left)


@pytest.mark.parametrize("seed", range(4))
def test_every_step_matches_the_documented_rule(seed):
    rng = random.Random(seed)
    growth_factor, backoff_factor = rng.choice([2.0, 3.0]), rng.choice([0.5, 0.3])
    growth_interval, hysteresis = rng.randint(1, 6), rng.randint(1, 4)
    scale, growth_tracker, hysteresis_tracker = _state(2.0 ** 16, hysteresis)
    model = (2.0 ** 16, 0, hysteresis)
    for _ in range(300):
        found = rng.choice([0.0, 0.0, 0.0, 1.0, 1.0, 2.0])
        returned = amp_C.update_scale_hysteresis(scale, growth_tracker, hysteresis_tracker, torch.tensor([found]),
                                                 growth_factor, backoff_factor, growth_interval, hysteresis)
        model = _model_step(model, found, growth_factor, backoff_factor, growth_interval, hysteresis)
        assert returned is scale
        assert (scale.item(), growth_tracker.item(), hysteresis_tracker.item()) == model


def test_scale_never_grows_to_inf_and_backs_off_to_zero():
    scale, growth_tracker, hysteresis_tracker = _state(torch.finfo(torch.float32).max / 2, 1)
    amp_C.update_scale_hysteresis(scale, growth_tracker, hysteresis_tracker, torch.tensor([0.0]), 4.0, 0.5, 1, 1)
    assert scale.item() == torch.finfo(torch.float32).max / 2  # growth would overflow: kept
    scale.fill_(SMALLEST_NORMAL)
    amp_C.update_scale_hysteresis(scale, growth_tracker, hysteresis_tracker, torch.tensor([1.0]), 4.0, 0.5, 1, 1)
    assert scale.item() == 0.0  # below fp32's smallest normal: flushed to zero, as apex's kernel did


@pytest.mark.parametrize("bad,match", [
    (dict(current_scale=torch.tensor([1.0], dtype=torch.float64)), "current_scale must be float32"),
    (dict(growth_tracker=torch.tensor([0.0])), "growth_tracker must be an integer tensor"),
    (dict(found_inf=torch.zeros(2)), "found_inf must be a one-element tensor"),
])
def test_bad_state_is_refused_with_the_fix(bad, match):
    scale, growth_tracker, hysteresis_tracker = _state(1.0, 2)
    state = dict(current_scale=scale, growth_tracker=growth_tracker, hysteresis_tracker=hysteresis_tracker,
                 found_inf=torch.zeros(1))
    state.update(bad)
    with pytest.raises((TypeError, ValueError), match=match):
        amp_C.update_scale_hysteresis(**state, growth_factor=2.0, backoff_factor=0.5, growth_interval=10,
                                      hysteresis=2)
