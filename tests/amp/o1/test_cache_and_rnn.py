"""Cast cache (one cast per weight per iteration, never stale) and RNN casting under O1."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from apexlite import amp
from apexlite.amp.session import current_session

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts


def count_casts(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(evt.count for evt in prof.key_averages() if evt.key == "aten::_to_copy")


@pytest.fixture
def o1_model():
    model = torch.nn.Linear(6, 6)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    yield model, opt
    amp.deinitialize()


class Thrice(torch.nn.Module):
    """One forward that uses the same Linear three times."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x):
        return self.linear(self.linear(self.linear(x)))


def test_weight_used_three_times_in_one_forward_is_cast_once():
    model = Thrice()
    amp.initialize(model, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        x = torch.randn(2, 6)
        # x once, weight once, bias once; without the cache weight and bias would be cast three times each
        assert count_casts(lambda: model(x)) == 3
        assert current_session().cache.hits == 4
        # a second forward starts a fresh scope: its weights are cast again (they may have changed)
        assert count_casts(lambda: model(x)) == 3
    finally:
        amp.deinitialize()


def test_optimizer_step_invalidates_cached_casts(o1_model):
    model, opt = o1_model
    x = torch.randn(2, 6)
    with amp.scale_loss(model(x).float().sum(), opt) as scaled:
        scaled.backward()
    opt.step()
    out = model(x)
    expected = torch.nn.functional.linear(x.bfloat16(), model.weight.detach().bfloat16(), model.bias.detach().bfloat16())
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_in_place_edit_within_an_iteration_forces_a_fresh_cast(o1_model):
    model, _ = o1_model
    x = torch.randn(2, 6)
    model(x)
    with torch.no_grad():
        model.weight.add_(1.0)
    out = model(x)
    expected = torch.nn.functional.linear(x.bfloat16(), model.weight.detach().bfloat16(), model.bias.detach().bfloat16())
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_no_grad_casts_are_not_reused_for_training(o1_model):
    model, opt = o1_model
    x = torch.randn(2, 6)
    with torch.no_grad():
        model(x)
    loss = model(x).float().sum()
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    assert model.weight.grad is not None
    torch.testing.assert_close(model.weight.grad, x.bfloat16().float().sum(0).expand(6, 6), rtol=1e-2, atol=1e-2)


def test_eval_only_loop_keeps_the_cache_bounded(o1_model):
    model, _ = o1_model
    with torch.no_grad():
        for _ in range(50):
            model(torch.randn(2, 6))
    assert len(current_session().cache) <= 2


def _functional_forward(model, x):
    """The model's math without calling the model, so no forward scope ends and the cache keeps its casts."""
    return torch.nn.functional.linear(x, model.weight, model.bias)


def test_scale_loss_exit_clears_the_cache(o1_model):
    model, opt = o1_model
    loss = _functional_forward(model, torch.randn(2, 6)).float().sum()
    assert len(current_session().cache) == 2
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    assert len(current_session().cache) == 0


def test_the_end_of_a_models_forward_clears_the_cache(o1_model):
    model, _ = o1_model
    model(torch.randn(2, 6))
    assert len(current_session().cache) == 0


RNNS = [
    (torch.nn.RNN, dict(nonlinearity="relu")), (torch.nn.RNN, dict(nonlinearity="tanh")),
    (torch.nn.GRU, {}), (torch.nn.LSTM, {}), (torch.nn.LSTM, dict(num_layers=2, bidirectional=True)),
]


@pytest.mark.parametrize("cls,kwargs", RNNS, ids=lambda v: str(v))
def test_rnns_run_in_low_precision_and_match_a_hand_cast_copy(cls, kwargs):
    rnn = cls(4, 5, **kwargs)
    reference = cls(4, 5, **kwargs)
    reference.load_state_dict(rnn.state_dict())
    reference.bfloat16()
    x = torch.randn(3, 2, 4, requires_grad=True)
    expected, _ = reference(x.detach().bfloat16())
    amp.initialize(rnn, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        out, _ = rnn(x)
        out.float().sum().backward()
    finally:
        amp.deinitialize()
    assert out.dtype is torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert x.grad.dtype is torch.float32


@pytest.mark.parametrize("cls", [torch.nn.RNNCell, torch.nn.GRUCell, torch.nn.LSTMCell], ids=lambda c: c.__name__)
def test_rnn_cells_run_in_low_precision(cls):
    cell = cls(4, 5)
    x = torch.randn(2, 4)
    amp.initialize(cell, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        out = cell(x)
    finally:
        amp.deinitialize()
    for tensor in (out if isinstance(out, tuple) else (out,)):
        assert tensor.dtype is torch.bfloat16


def test_scale_loss_lets_backward_free_the_weight_casts(o1_model):
    # like torch.autocast: once the forward is over the cache lets go, so each low-precision weight
    # copy dies as soon as the backward node that saved it has run, not at the end of the iteration
    import weakref

    model, opt = o1_model
    loss = _functional_forward(model, torch.randn(2, 6)).float().sum()
    casts = [weakref.ref(entry[-1]) for entry in current_session().cache.entries()]
    assert len(casts) == 2 and all(ref() is not None for ref in casts)
    with amp.scale_loss(loss, opt) as scaled:
        assert len(current_session().cache) == 0
        del loss
        scaled.backward()
        del scaled
        assert all(ref() is None for ref in casts)
