"""`scale_loss(..., delay_overflow_check=True)` and the scaler's `_overflow_buf`, as NVIDIA's BERT uses them.

BERT's `take_optimizer_step` all-reduces the master grads itself, checks them with its own overflow
buffer, swaps that buffer into the loss scaler, calls `update_scale()` and skips the step itself on an
overflow; then drops the masters' grads through `optimizer._amp_stash.all_fp32_from_fp16_params`. The
reference is apexlite's ordinary loop (the check in scale_loss, the skip in step), which must give the
same params bit for bit, with one halving of the scale per overflow.
"""
import pytest
import torch

from apexlite import amp
from apexlite.amp.session import current_session
from apexlite.compat import amp_C
from apexlite.optimizers import FusedAdam

pytestmark = pytest.mark.usefixtures("cast_path")
MICRO_BATCHES = 2
OPTIMIZERS = {"SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
              "FusedAdam": lambda params: FusedAdam(params, lr=1e-2)}


@pytest.fixture(autouse=True)
def _teardown():
    yield
    amp.deinitialize()


def _setup(level, opt_name, verbosity=0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = OPTIMIZERS[opt_name](model.parameters())
    model, opt = amp.initialize(model, opt, opt_level=level, loss_scale="dynamic", verbosity=verbosity)
    return model, opt


def _batch(step, micro, poisoned):
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(10 * step + micro))
    if poisoned:
        x[0, 0] = float("inf")
    return x


def _backward(model, opt, x, **kwargs):
    dtype = next(model.parameters()).dtype
    with amp.scale_loss(model(x.to(dtype)).float().pow(2).mean() / MICRO_BATCHES, opt, **kwargs) as scaled:
        scaled.backward()


def _bert_step(opt, scaler):
    """BERT's take_optimizer_step on one process: its own overflow buffer over the master grads."""
    overflow_buf = torch.zeros(1, dtype=torch.int)
    grads = [p.grad for p in amp.master_params(opt) if p.grad is not None]
    amp_C.multi_tensor_scale(65536, overflow_buf, [grads, grads], 1.0)
    old = scaler._overflow_buf
    scaler._overflow_buf = overflow_buf
    overflowed = scaler.update_scale()
    scaler._overflow_buf = old
    if overflowed:
        if current_session().properties.master_weights:
            for param in opt._amp_stash.all_fp32_from_fp16_params:
                param.grad = None
    else:
        opt.step()
    opt.zero_grad()
    return overflowed


def _run(level, opt_name, poisoned_at, bert):
    model, opt = _setup(level, opt_name)
    scaler = amp._amp_state.loss_scalers[0]
    trace = []
    for step in range(4):
        for micro in range(MICRO_BATCHES):
            x = _batch(step, micro, (step, micro) == poisoned_at)
            _backward(model, opt, x, delay_overflow_check=bert)
        if bert:
            skipped = _bert_step(opt, scaler)
        else:
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            opt.zero_grad()
            skipped = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        trace.append((skipped, scaler.loss_scale()))
    params = [p.detach().clone() for p in model.parameters()]
    amp.deinitialize()
    return params, trace


@pytest.mark.parametrize("poisoned_at", [None, (1, 0), (1, 1)], ids=["clean", "first-micro-batch", "last-micro-batch"])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_berts_own_check_trains_as_the_ordinary_loop(level, opt_name, poisoned_at):
    bert_params, bert_trace = _run(level, opt_name, poisoned_at, bert=True)
    params, trace = _run(level, opt_name, poisoned_at, bert=False)
    expected_skips = [step == (poisoned_at or (None,))[0] for step in range(4)]
    assert [skipped for skipped, _ in bert_trace] == expected_skips
    halved = 32768.0 if poisoned_at else 65536.0
    assert [scale for _, scale in bert_trace] == [65536.0] + [halved] * 3
    assert [scale for _, scale in trace] == [scale for _, scale in bert_trace]
    for a, b in zip(bert_params, params):
        assert torch.equal(a, b)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_a_step_without_update_scale_is_still_checked(level, caplog):
    """delay_overflow_check=True and no update_scale() before step(): apexlite checks then and skips an
    overflowed step (apex stepped on the inf/NaN grads); a clean one steps."""
    model, opt = _setup(level, "SGD", verbosity=1)
    scaler = amp._amp_state.loss_scalers[0]
    _backward(model, opt, _batch(0, 0, True), delay_overflow_check=True)
    assert scaler.loss_scale() == 65536.0  # nothing decided in scale_loss
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert scaler.loss_scale() == 32768.0
    assert "no update_scale() was called before optimizer.step()" in caplog.text
    opt.zero_grad()
    _backward(model, opt, _batch(1, 0, False), delay_overflow_check=True)
    opt.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert scaler.loss_scale() == 32768.0


def test_a_swapped_overflow_buffer_decides_update_scale():
    """update_scale reads `_overflow_buf` (apex's flag): a script's buffer holding 1 is an overflow."""
    _setup("O1", "SGD")
    scaler = amp._amp_state.loss_scalers[0]
    own = scaler._overflow_buf
    assert own.dtype == torch.int32 and own.tolist() == [0]
    scaler._overflow_buf = torch.ones(1, dtype=torch.int)
    assert scaler.update_scale() is True and scaler.loss_scale() == 32768.0
    scaler.clear_overflow_state()
    assert scaler._overflow_buf.tolist() == [0] and scaler.update_scale() is False


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_the_stash_lists_apexs_master_weight_lists(opt_name):
    model, opt = _setup("O2", opt_name)
    stash = opt._amp_stash
    halves = [p for p in model.parameters() if p.dtype == torch.float16]
    fp32 = [p for p in model.parameters() if p.dtype == torch.float32]  # BatchNorm, kept fp32
    assert halves and fp32
    assert all(a is b for a, b in zip(stash.all_fp16_params, halves)) and len(stash.all_fp16_params) == len(halves)
    masters = stash.all_fp32_from_fp16_params
    assert [m.dtype for m in masters] == [torch.float32] * len(halves)
    assert all(torch.equal(m.half(), h) for m, h in zip(masters, halves))  # (masters keep the fp32 weights)
    assert {id(p) for p in amp.master_params(opt)} == {id(p) for p in masters + stash.all_fp32_from_fp32_params}
    assert sorted(map(id, stash.all_fp32_from_fp32_params)) == sorted(map(id, fp32))
    assert [len(g) for g in stash.fp16_groups] == [len(halves)] and len(stash.fp32_from_fp16_groups[0]) == len(halves)
    assert len(stash.fp32_from_fp32_groups[0]) == len(fp32)


def test_without_master_weights_the_stash_has_no_master_lists():
    _, opt = _setup("O1", "SGD")
    for name in ("all_fp16_params", "all_fp32_from_fp16_params", "fp16_groups", "fp32_from_fp32_groups"):
        assert not hasattr(opt._amp_stash, name)
