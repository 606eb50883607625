"""A skipped (overflowed) step drops the grads it would have used, at every opt level and grad path.

Later backward passes add to older grads without checking them again (they were checked when they were
made), so overflowed grads kept past their skipped step used to reach the next step: a loop that did
not call zero_grad between an overflow and the next backward wrote NaN into the weights (every weight at
O1, fp32 batchnorm params at O2). The reference is the same run with zero_grad after the overflow.
"""
import pytest
import torch

from apexlite import amp
from apexlite.optimizers import FusedAdam

pytestmark = pytest.mark.usefixtures("cast_path")

LEVELS = ["O0", "O1", "O2", "O3"]
OPTIMIZERS = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "FusedAdam": lambda params: FusedAdam(params, lr=1e-2),  # O2: the fused-master path
}


@pytest.fixture(autouse=True)
def _teardown():
    yield
    amp.deinitialize()


def run(level, opt_name, zero_grad_after_overflow):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = OPTIMIZERS[opt_name](model.parameters())
    model, opt = amp.initialize(model, opt, opt_level=level, loss_scale="dynamic", verbosity=0)
    dtype = next(model.parameters()).dtype
    for index, poisoned in enumerate((False, True, False, False)):
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(index))
        if poisoned:
            x[0, 0] = float("inf")
        with amp.scale_loss(model(x.to(dtype)).float().pow(2).mean(), opt) as scaled:
            scaled.backward()
        opt.step()
        if not poisoned or zero_grad_after_overflow:
            opt.zero_grad()
    params = [p.detach().clone() for p in model.parameters()]
    amp.deinitialize()
    return params


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("level", LEVELS)
def test_an_overflowed_steps_grads_never_reach_a_later_step(level, opt_name):
    expected = run(level, opt_name, zero_grad_after_overflow=True)
    got = run(level, opt_name, zero_grad_after_overflow=False)
    assert all(torch.isfinite(p).all() for p in got)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
