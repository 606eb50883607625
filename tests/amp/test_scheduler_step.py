"""amp.initialize replaces optimizer.step only where apex did (master weights, O1), so LR schedulers warn
exactly when they warned with apex, and the numbers are the same whichever way amp reaches the step.

apex (amp/_process_optimizer.py and _initialize.py) bound a new step to the optimizer when
master_weights was on and when patch_torch_functions was on; after an overflow it replaced the step
for one call. torch's LRScheduler warns at its first step when `optimizer.step` is no longer its own
wrapper ("overridden after learning rate scheduler initialization"), or when its wrapper did not run
before `scheduler.step()` ("Detected call of `lr_scheduler.step()` before `optimizer.step()`").
"""
import warnings

import pytest
import torch

from apexlite import amp
from apexlite.amp.errors import AmpStateError, AmpUsageError
from apexlite.amp.session import current_session

OVERRIDDEN = "has been overridden after learning rate scheduler initialization"
BEFORE_OPTIMIZER = "Detected call of `lr_scheduler.step()` before `optimizer.step()`"

# (opt_level, overrides, whether apex replaced optimizer.step: master_weights or patch_torch_functions)
LEVELS = [
    ("O0", {}, False),
    ("O1", {}, True),
    ("O2", {}, True),
    ("O3", {}, False),
    ("O2", {"master_weights": False}, False),
    ("O3", {"master_weights": True}, True),
]
LEVEL_IDS = [level + "".join(f"-{k}={v}" for k, v in overrides.items()) for level, overrides, _ in LEVELS]


@pytest.fixture(autouse=True)
def _teardown():
    yield
    amp.deinitialize()


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _batches(count):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=generator), torch.randn(4, 4, generator=generator)) for _ in range(count)]


def _train(level, overrides, scheduler_when, steps=3, loss_factor=1e-3):
    """Train a few steps under amp; returns (scheduler warnings, final fp32 params, skipped steps)."""
    model, optimizer = _model_and_optimizer()
    scheduler = None
    if scheduler_when == "before":
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer = amp.initialize(model, optimizer, opt_level=level, verbosity=0, **overrides)
    if scheduler_when == "after":
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    dtype = next(model.parameters()).dtype
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for inputs, target in _batches(steps):
            loss = torch.nn.functional.mse_loss(model(inputs.to(dtype)).float(), target) * loss_factor
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            optimizer.step()
            optimizer.zero_grad()
            if scheduler is not None:
                scheduler.step()
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    params = [p.detach().float().clone() for p in amp.master_params(optimizer)]
    skipped = current_session().stats.skipped_steps
    amp.deinitialize()
    return messages, params, skipped


def _scheduler_warnings(messages):
    return [m for m in messages if OVERRIDDEN in m or BEFORE_OPTIMIZER in m]


@pytest.mark.parametrize("level,overrides,apex_replaced", LEVELS, ids=LEVEL_IDS)
def test_scheduler_built_before_initialize_warns_where_apex_replaced_the_step(level, overrides, apex_replaced):
    messages, _, skipped = _train(level, overrides, "before")
    assert skipped == 0
    expected = [OVERRIDDEN] if apex_replaced else []
    assert [OVERRIDDEN for m in _scheduler_warnings(messages) if OVERRIDDEN in m] == expected
    assert not [m for m in messages if BEFORE_OPTIMIZER in m]


@pytest.mark.parametrize("level,overrides,apex_replaced", LEVELS, ids=LEVEL_IDS)
def test_scheduler_built_after_initialize_never_warns_and_wraps_amps_step(level, overrides, apex_replaced):
    messages, _, skipped = _train(level, overrides, "after")
    assert skipped == 0
    assert _scheduler_warnings(messages) == []


@pytest.mark.parametrize("level,overrides,apex_replaced", LEVELS, ids=LEVEL_IDS)
def test_where_amp_reaches_the_step(level, overrides, apex_replaced):
    model, optimizer = _model_and_optimizer()
    class_step = type(optimizer).step
    amp.initialize(model, optimizer, opt_level=level, verbosity=0, **overrides)
    assert ("step" in vars(optimizer)) is apex_replaced
    if not apex_replaced:
        assert optimizer.step.__func__ is class_step
        assert len(optimizer._optimizer_step_pre_hooks) == 1 and len(optimizer._optimizer_step_post_hooks) == 1
    amp.deinitialize()
    assert "step" not in vars(optimizer)
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks


@pytest.mark.parametrize("level,overrides,apex_replaced", LEVELS, ids=LEVEL_IDS)
def test_numbers_do_not_depend_on_when_the_scheduler_was_built(level, overrides, apex_replaced):
    _, before, _ = _train(level, overrides, "before")
    _, after, _ = _train(level, overrides, "after")
    for left, right in zip(before, after):
        assert torch.equal(left, right)


def test_o0_with_hooks_trains_exactly_like_torch():
    """O0 reaches the step through hooks: params equal plain fp32 torch training with the same scheduler."""
    _, amp_params, _ = _train("O0", {}, "before", steps=4)
    model, optimizer = _model_and_optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for inputs, target in _batches(4):
        (torch.nn.functional.mse_loss(model(inputs), target) * 1e-3).backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    for reference, got in zip(model.parameters(), amp_params):
        assert torch.equal(reference.detach(), got)


# After an overflow, apex replaced step for one call: the scheduler's wrapper does not run for the
# skipped step, so a first-iteration overflow makes torch report scheduler.step() before optimizer.step().
OVERFLOW_CASES = [
    ("O0", {"loss_scale": "dynamic"}, "before", [BEFORE_OPTIMIZER]),
    ("O0", {"loss_scale": "dynamic"}, "after", [BEFORE_OPTIMIZER]),
    ("O3", {"loss_scale": "dynamic"}, "after", [BEFORE_OPTIMIZER]),
    ("O1", {}, "before", [OVERRIDDEN]),
    ("O1", {}, "after", [BEFORE_OPTIMIZER]),
    ("O2", {}, "before", [OVERRIDDEN]),
    ("O2", {}, "after", [BEFORE_OPTIMIZER]),
]


@pytest.mark.parametrize("level,overrides,when,expected", OVERFLOW_CASES)
def test_first_step_overflow_warns_as_apex_did(level, overrides, when, expected):
    messages, _, skipped = _train(level, overrides, when, steps=2, loss_factor=1e38)
    assert skipped >= 1
    found = [key for key in (OVERRIDDEN, BEFORE_OPTIMIZER) for m in _scheduler_warnings(messages) if key in m]
    assert found == expected


@pytest.mark.parametrize("level", ["O0", "O2"])
def test_overflowing_step_leaves_params_and_state_unchanged(level):
    model, optimizer = _model_and_optimizer()
    model, optimizer = amp.initialize(model, optimizer, opt_level=level, loss_scale="dynamic", verbosity=0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    (inputs, target), = _batches(1)
    dtype = next(model.parameters()).dtype
    params_before = [p.detach().clone() for p in amp.master_params(optimizer)]
    loss = torch.nn.functional.mse_loss(model(inputs.to(dtype)).float(), target) * 1e38
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    assert optimizer._amp_stash.already_patched
    optimizer.step()
    assert not optimizer._amp_stash.already_patched
    assert hasattr(optimizer.step, "_wrapped_by_lr_sched")  # the scheduler's wrapper is back
    for before, after in zip(params_before, amp.master_params(optimizer)):
        assert torch.equal(before, after)
    assert not optimizer.state or all(not s for s in optimizer.state.values())
    with pytest.warns(UserWarning, match="before `optimizer.step"):
        scheduler.step()


def test_hooked_step_counts_a_subclass_calling_its_base_step_once():
    class Subclassed(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    model = torch.nn.Linear(4, 4)
    torch.optim.SGD(model.parameters(), lr=0.1)  # an SGD instance hooks SGD.step itself
    optimizer = Subclassed(model.parameters(), lr=0.1)
    amp.initialize(model, optimizer, opt_level="O0", verbosity=0)
    for _ in range(3):
        with amp.scale_loss(model(torch.randn(2, 4)).sum(), optimizer) as scaled:
            scaled.backward()
        optimizer.step()
    assert current_session().stats.steps == 3


def test_hooked_step_refuses_a_closure_and_scaled_grads():
    model, optimizer = _model_and_optimizer()
    amp.initialize(model, optimizer, opt_level="O0", loss_scale=128.0, verbosity=0)
    with pytest.raises(AmpUsageError, match="closure"):
        optimizer.step(lambda: 0.0)
    with amp.scale_loss(model(torch.randn(2, 8)).sum(), optimizer, delay_unscale=True) as scaled:
        scaled.backward()
    with pytest.raises(AmpStateError, match="still scaled"):
        optimizer.step()


def test_hooked_step_refuses_a_step_that_bypassed_the_skip():
    """A reference to the step taken before an overflow cannot skip: the hook refuses it loudly."""
    model, optimizer = _model_and_optimizer()
    amp.initialize(model, optimizer, opt_level="O0", loss_scale="dynamic", verbosity=0)
    captured_step = optimizer.step
    params_before = [p.detach().clone() for p in model.parameters()]
    with amp.scale_loss(model(torch.randn(2, 8)).sum() * 1e38, optimizer) as scaled:
        scaled.backward()
    with pytest.raises(AmpStateError, match="after a gradient overflow"):
        captured_step()
    for before, after in zip(params_before, model.parameters()):
        assert torch.equal(before, after)
    optimizer.step()  # the attribute still skips
    for before, after in zip(params_before, model.parameters()):
        assert torch.equal(before, after)


class _Wrapper:
    """An optimizer wrapper that is not a torch optimizer (as LARC is): no step hooks of its own."""

    def __init__(self, optimizer):
        self.optim = optimizer

    @property
    def param_groups(self):
        return self.optim.param_groups

    @property
    def state(self):
        return self.optim.state

    def step(self):
        return self.optim.step()

    def zero_grad(self, set_to_none=True):
        self.optim.zero_grad(set_to_none=set_to_none)


def test_a_wrapper_without_step_hooks_gets_the_replaced_step_and_still_skips():
    model, inner = _model_and_optimizer()
    wrapper = _Wrapper(inner)
    amp.initialize(model, wrapper, opt_level="O0", loss_scale="dynamic", verbosity=0)
    assert "step" in vars(wrapper) and not inner._optimizer_step_pre_hooks
    params_before = [p.detach().clone() for p in model.parameters()]
    with amp.scale_loss(model(torch.randn(2, 8)).sum() * 1e38, wrapper) as scaled:
        scaled.backward()
    wrapper.step()
    assert all(torch.equal(b, a) for b, a in zip(params_before, model.parameters()))
    wrapper.zero_grad()
    with amp.scale_loss(model(torch.randn(2, 8)).sum(), wrapper) as scaled:
        scaled.backward()
    wrapper.step()
    assert not all(torch.equal(b, a) for b, a in zip(params_before, model.parameters()))
    assert current_session().stats.steps == 1 and current_session().stats.skipped_steps == 1
    amp.deinitialize()
    assert "step" not in vars(wrapper)
