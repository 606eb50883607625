"""Probe: an exception inside `scale_loss` (a metric check or logging after `backward()`) must leave
the grads as a correct unscaled backward would, and the loss scaler untouched.

Before, the block's grads stayed multiplied by the loss scale (65536x) on params whose `.grad` was
None before the block, so a loop that caught the error and zeroed grads only after `step()` applied
a 65536x update on the next step.
"""

import pytest
import torch

from apexlite import amp
from apexlite.amp.session import current_session

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

LEVELS = [("O1", "sgd"), ("O2", "sgd"), ("O2", "fused_adam"), ("O3", "sgd")]


class MetricFailed(RuntimeError):
    pass


def build(opt_level, optimizer_kind, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    if optimizer_kind == "fused_adam":
        from apexlite.optimizers import FusedAdam

        opt = FusedAdam(model.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_scale = 1024.0 if opt_level == "O3" else "dynamic"
    return amp.initialize(model, opt, opt_level=opt_level, loss_scale=loss_scale, verbosity=0)


def loss_of(model, x):
    return model(x).float().pow(2).mean()


def grads_of(model, opt):
    """What the optimizer will step with (fp32 masters' grads under O2)."""
    params = list(amp.master_params(opt))
    return [None if p.grad is None else p.grad.detach().float().clone() for p in params]


@pytest.mark.parametrize("opt_level,kind", LEVELS, ids=lambda v: str(v))
def test_grads_after_a_raising_block_equal_a_clean_block(opt_level, kind):
    x = torch.randn(4, 6)
    results = []
    for raise_inside in (False, True):
        model, opt = build(opt_level, kind)
        try:
            scale_before = amp.state_dict()
            try:
                with amp.scale_loss(loss_of(model, x), opt) as scaled:
                    scaled.backward()
                    if raise_inside:
                        raise MetricFailed("metric check failed")
            except MetricFailed:
                pass
            results.append(grads_of(model, opt))
            if raise_inside:
                assert amp.state_dict() == scale_before  # the scaler did not advance
        finally:
            amp.deinitialize()
    clean, raised = results
    for a, b in zip(clean, raised):
        assert torch.equal(a, b)


@pytest.mark.parametrize("opt_level,kind", LEVELS, ids=lambda v: str(v))
def test_catch_and_continue_loop_trains_like_one_without_the_error(opt_level, kind):
    """The loop from the report: on error `continue`, zero grads only after step()."""
    data = [torch.randn(4, 6) for _ in range(6)]
    finals = []
    for fail_at in (None, 2):
        model, opt = build(opt_level, kind)
        try:
            for step, x in enumerate(data):
                try:
                    with amp.scale_loss(loss_of(model, x), opt) as scaled:
                        scaled.backward()
                        if step == fail_at:
                            raise MetricFailed("logging failed")
                except MetricFailed:
                    continue  # grads of this batch stay and join the next batch's
                opt.step()
                opt.zero_grad()
            finals.append([p.detach().float().clone() for p in model.parameters()])
        finally:
            amp.deinitialize()
    clean, with_error = finals
    # the run with the error summed batch 2's (unscaled) grads into batch 3's step: a small, finite
    # difference; a scaled leftover would have moved weights by ~1000x the learning rate
    for a, b in zip(clean, with_error):
        assert torch.isfinite(b).all()
        assert (a - b).abs().max() < 0.5


def test_an_overflowing_raising_block_drops_its_grads_and_keeps_the_older_ones():
    model, opt = build("O1", "sgd")
    try:
        x = torch.randn(4, 6)
        with amp.scale_loss(loss_of(model, x), opt, delay_unscale=False) as scaled:
            scaled.backward()
        before = grads_of(model, opt)
        try:
            with amp.scale_loss(loss_of(model, x), opt) as scaled:
                scaled.backward()
                model[0].weight.grad[0, 0] = float("inf")
                raise MetricFailed("after an overflow")
        except MetricFailed:
            pass
        for a, b in zip(before, grads_of(model, opt)):
            assert torch.equal(a, b)
        assert current_session().loss_scalers[0].loss_scale() == 2.0 ** 16
        weights = [p.detach().clone() for p in model.parameters()]
        opt.step()  # steps with the older, finite grads: not skipped, not poisoned
        assert all(torch.isfinite(p).all() for p in model.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    finally:
        amp.deinitialize()


def test_error_before_backward_restores_the_older_grads():
    model, opt = build("O1", "sgd")
    try:
        x = torch.randn(4, 6)
        with amp.scale_loss(loss_of(model, x), opt) as scaled:
            scaled.backward()
        before = grads_of(model, opt)
        with pytest.raises(MetricFailed):
            with amp.scale_loss(loss_of(model, x), opt):
                raise MetricFailed("before backward")
        for a, b in zip(before, grads_of(model, opt)):
            assert torch.equal(a, b)
    finally:
        amp.deinitialize()


def test_the_exception_propagates_unchanged():
    model, opt = build("O2", "sgd")
    try:
        error = MetricFailed("the user's own")
        with pytest.raises(MetricFailed) as caught:
            with amp.scale_loss(loss_of(model, torch.randn(4, 6)), opt) as scaled:
                scaled.backward()
                raise error
        assert caught.value is error
    finally:
        amp.deinitialize()
