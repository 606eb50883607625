"""Every grad strategy AmpOptimizer can be given implements GradStrategy, with the Protocol's signatures."""
import inspect

import pytest

from apexlite.amp.plain_grads import PlainGrads
from apexlite.amp.fused_master import FusedMasterGrads
from apexlite.amp.grad_strategy import GradStrategy
from apexlite.amp.master import MasterParams

METHODS = sorted(name for name, value in vars(GradStrategy).items()
                 if callable(value) and not name.startswith("_"))


@pytest.mark.parametrize("strategy", [PlainGrads, MasterParams, FusedMasterGrads], ids=lambda c: c.__name__)
@pytest.mark.parametrize("method", METHODS)
def test_strategy_implements_the_protocol_method(strategy, method):
    implementation = getattr(strategy, method, None)
    assert callable(implementation), f"{strategy.__name__} lacks {method}"
    wanted = list(inspect.signature(getattr(GradStrategy, method)).parameters)
    got = list(inspect.signature(implementation).parameters)
    assert got[:len(wanted)] == wanted, f"{strategy.__name__}.{method}{tuple(got)} != {tuple(wanted)}"


def test_a_live_strategy_is_a_grad_strategy():
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    assert isinstance(PlainGrads(optimizer), GradStrategy)
    assert METHODS  # the Protocol declares methods to check
