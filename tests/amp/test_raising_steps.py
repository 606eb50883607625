"""Issue 22 item 2: an O2 step that raises anywhere leaves the model on its fp32 masters.

The masters are the truth (NOTE [the masters are the truth] in apexlite/amp/master.py): after any
exception out of `optimizer.step()` (a step pre- or post-hook, per-optimizer or global, the optimizer
itself part-way through its param groups, the master->model copy, the overflow report of a skipped
step; Exception, KeyboardInterrupt or another BaseException) every model param equals its master cast
to the model's dtype, bit for bit, in the live tensors and in `model.state_dict()` against
`optimizer.state_dict()`. Training on from there gives exactly the numbers of a run in which nothing
raised: a step whose update finished counts as done, one that raised before its update can be retried.
Every case runs for the separate-masters path (torch optimizers, FusedAdam opted out) and for
FusedAdam's fused-master path (compiled kernel and torch ops), in sessions on both O1 cast paths.
"""
import contextlib
import logging

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from apexlite import amp
from apexlite.amp.checkpoint_convert import MASTERS_KEY
from apexlite.amp.fused_master import FusedMasterGrads
from apexlite.amp.master import MasterParams
from apexlite.amp.session import current_session
from apexlite.optimizers import FusedAdam

LOW = torch.float16


class Cancelled(BaseException):
    """A BaseException that is none of Python's own (a framework's cancellation signal)."""


EXCEPTIONS = {"RuntimeError": RuntimeError, "KeyboardInterrupt": KeyboardInterrupt}


def _fused_adam(implementation, fused_masters):
    def build(params):
        opt = FusedAdam(params, lr=1e-2, weight_decay=0.01, implementation=implementation)
        opt.amp_fused_master_step = fused_masters
        return opt
    return build


OPTIMIZERS = {  # name: (factory, grad strategy amp must pick)
    "SGD": (lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9), MasterParams),
    "Adam": (lambda params: torch.optim.Adam(params, lr=1e-2), MasterParams),
    "FusedAdam-separate-masters": (_fused_adam("auto", False), MasterParams),
    "FusedAdam-fused-masters-kernel": (_fused_adam("auto", True), FusedMasterGrads),
    "FusedAdam-fused-masters-torch-ops": (_fused_adam("reference", True), FusedMasterGrads),
}
@pytest.fixture(autouse=True)
def _teardown():
    yield
    amp.deinitialize()


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def build(opt_name, groups=1, verbosity=0):
    torch.manual_seed(0)
    model = mlp()
    factory, strategy = OPTIMIZERS[opt_name]
    if groups == 1:
        opt = factory(model.parameters())
    else:
        opt = factory([{"params": model[0].parameters()}, {"params": model[2].parameters()}])
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=verbosity)
    assert type(current_session().amp_optimizer(opt).grads) is strategy
    return model, opt


def backward(model, opt, index, clip=False, poison=False):
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(100 + index))
    if poison:
        x[0, 0] = float("inf")
    with amp.scale_loss(model(x.to(LOW)).float().pow(2).mean(), opt) as scaled:
        scaled.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(amp.master_params(opt), 0.05)


def clean_step(model, opt, index, clip=False):
    backward(model, opt, index, clip)
    opt.step()
    opt.zero_grad()


def pairs(opt):
    """(model param, fp32 master) for every half param, read without changing amp's grad mode."""
    return current_session().amp_optimizer(opt).grads.master_pairs()


def bits(tensor):
    return tensor.detach().view(torch.int16 if tensor.element_size() == 2 else torch.int32).clone()


def snapshot(opt):
    return [(bits(p), bits(m)) for p, m in pairs(opt)]


def assert_model_follows_masters(model, opt):
    """Live params and model.state_dict() equal the masters (live and in opt.state_dict()), bit for bit."""
    live = pairs(opt)
    assert live
    for param, master in live:
        assert torch.equal(bits(param), bits(master.to(param.dtype)))
    names = {id(p): name for name, p in model.named_parameters()}
    saved_model = model.state_dict()  # O2's model.state_dict() is fp32 (apex's hook): the half values, widened
    saved_opt = opt.state_dict()
    if MASTERS_KEY in saved_opt:
        saved_masters = saved_opt[MASTERS_KEY]
    else:
        position = {id(p): i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
        saved_masters = [saved_opt["state"][position[id(p)]]["master_param"] for p, _ in live]
    for (param, _), master in zip(live, saved_masters):
        assert torch.equal(saved_model[names[id(param)]].to(param.dtype), master.to(param.dtype))


_REFERENCES = {}


def reference(opt_name, cast_path, clip):
    """Params and masters after three clean steps (nothing raising), computed once per configuration."""
    key = (opt_name, cast_path, clip)
    if key not in _REFERENCES:
        model, opt = build(opt_name)
        for index in range(3):
            clean_step(model, opt, index, clip)
        _REFERENCES[key] = snapshot(opt)
        amp.deinitialize()
    return _REFERENCES[key]


class Raiser:
    """A step hook that raises `exc` while armed (a logging hook's bug, a Ctrl-C landing in a hook)."""

    def __init__(self, exc):
        self.exc = exc
        self.armed = False
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        if self.armed:
            raise self.exc("raised in a step hook")


HOOKS = {  # name: (register(optimizer, hook) -> handle, registered before amp.initialize, runs after the update)
    "optimizer-pre-hook": (lambda opt, hook: opt.register_step_pre_hook(hook), False, False),
    "global-pre-hook": (lambda opt, hook: register_optimizer_step_pre_hook(hook), False, False),
    "optimizer-post-hook": (lambda opt, hook: opt.register_step_post_hook(hook), False, True),
    "optimizer-post-hook-registered-before-initialize": (lambda opt, hook: opt.register_step_post_hook(hook),
                                                         True, True),
    "global-post-hook": (lambda opt, hook: register_optimizer_step_post_hook(hook), False, True),
}


@contextlib.contextmanager
def removing(handle):
    try:
        yield handle
    finally:
        handle.remove()


@pytest.mark.parametrize("clip", [False, True], ids=["fast", "clipped"])
@pytest.mark.parametrize("exc", list(EXCEPTIONS))
@pytest.mark.parametrize("hook_kind", list(HOOKS))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_a_raising_step_hook_leaves_the_model_on_its_masters_and_training_exact(opt_name, hook_kind, exc,
                                                                                clip, cast_path):
    register, early, after_update = HOOKS[hook_kind]
    expected = reference(opt_name, cast_path, clip)
    hook = Raiser(EXCEPTIONS[exc])
    if early:
        torch.manual_seed(0)
        model = mlp()
        opt = OPTIMIZERS[opt_name][0](model.parameters())
        handle = register(opt, hook)
        model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    else:
        model, opt = build(opt_name)
        handle = register(opt, hook)
    with removing(handle):
        clean_step(model, opt, 0, clip)
        backward(model, opt, 1, clip)
        before = snapshot(opt)
        hook.armed = True
        with pytest.raises(EXCEPTIONS[exc], match="raised in a step hook"):
            opt.step()
        hook.armed = False
        assert_model_follows_masters(model, opt)
        changed = [not torch.equal(m0, bits(m)) for (_, m0), (_, m) in zip(before, pairs(opt))]
        assert all(changed) if after_update else not any(changed)
        if not after_update:
            opt.step()  # the retry computes what the step that raised would have
        opt.zero_grad()
        clean_step(model, opt, 2, clip)
    assert_model_follows_masters(model, opt)
    for (p, m), (ref_p, ref_m) in zip(snapshot(opt), expected):
        assert torch.equal(p, ref_p) and torch.equal(m, ref_m)
    assert not hasattr(opt, "grad_scale")


class ExplodingGroup(dict):
    """A param group whose hyperparameters raise when the optimizer reads them: the optimizer fails
    after updating the groups before this one (its params stay readable, as amp reads them)."""

    def __init__(self, group, exc):
        super().__init__(group)
        self.exc = exc

    def __getitem__(self, key):
        if key not in ("params", "step_count"):  # (step_count is read while planning, before any update)
            raise self.exc(f"reading {key!r} exploded")
        return super().__getitem__(key)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt, Cancelled], ids=lambda e: e.__name__)
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_an_optimizer_failing_part_way_through_its_groups_leaves_the_model_on_its_masters(opt_name, exc, cast_path):
    model, opt = build(opt_name, groups=2)
    clean_step(model, opt, 0)
    backward(model, opt, 1)
    first_group = [id(p) for p in model[0].parameters()]
    before = {id(p): bits(m) for p, m in pairs(opt)}
    group = opt.param_groups[1]
    opt.param_groups[1] = ExplodingGroup(group, exc)
    with pytest.raises(exc, match="exploded"):
        opt.step()
    opt.param_groups[1] = group
    updated = {id(p) for p, m in pairs(opt) if not torch.equal(before[id(p)], bits(m))}
    assert updated == set(first_group)  # the first group's masters moved, the second's did not
    assert_model_follows_masters(model, opt)
    opt.zero_grad()
    clean_step(model, opt, 2)
    assert_model_follows_masters(model, opt)
    assert all(torch.isfinite(p).all() for p in model.parameters())


SEPARATE_MASTERS = [name for name, (_, strategy) in OPTIMIZERS.items() if strategy is MasterParams]


@pytest.mark.parametrize("failures", ["once", "always"])
@pytest.mark.parametrize("exc", list(EXCEPTIONS))
@pytest.mark.parametrize("opt_name", SEPARATE_MASTERS)
def test_a_master_to_model_copy_that_raises_still_finishes_the_copy(opt_name, exc, failures, cast_path, monkeypatch):
    model, opt = build(opt_name)
    clean_step(model, opt, 0)
    backward(model, opt, 1)
    real_copy = torch._foreach_copy_
    raised = []

    def failing_copy(targets, sources, *args, **kwargs):
        if failures == "always" or not raised:
            raised.append(True)
            raise EXCEPTIONS[exc]("the batched copy failed")
        return real_copy(targets, sources, *args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_copy_", failing_copy)
    with pytest.raises(EXCEPTIONS[exc], match="the batched copy failed"):
        opt.step()
    monkeypatch.setattr(torch, "_foreach_copy_", real_copy)
    assert raised
    assert_model_follows_masters(model, opt)
    opt.zero_grad()
    clean_step(model, opt, 2)
    assert_model_follows_masters(model, opt)


@pytest.mark.parametrize("opt_name", ["Adam", "FusedAdam-fused-masters-kernel"])
def test_post_hooks_see_the_updated_model(opt_name, cast_path):
    """A checkpointing or EMA post-hook reads the model after the update, per-optimizer or global."""
    model, opt = build(opt_name)
    seen = []

    def record(*args):
        seen.append([(bits(p), bits(m.to(p.dtype))) for p, m in pairs(opt)])

    with removing(opt.register_step_post_hook(record)), removing(register_optimizer_step_post_hook(record)):
        clean_step(model, opt, 0)
    assert len(seen) == 2
    for recorded in seen:
        assert all(torch.equal(p, m) for p, m in recorded)


@pytest.mark.parametrize("exc", list(EXCEPTIONS))
@pytest.mark.parametrize("opt_name", ["SGD", "FusedAdam-fused-masters-kernel"])
def test_a_step_wrapped_by_a_scheduler_settles_the_same_way(opt_name, exc, cast_path):
    model, opt = build(opt_name)
    lr = opt.param_groups[0]["lr"]
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    hook = Raiser(EXCEPTIONS[exc])
    with removing(register_optimizer_step_post_hook(hook)):
        clean_step(model, opt, 0)
        scheduler.step()
        backward(model, opt, 1)
        hook.armed = True
        with pytest.raises(EXCEPTIONS[exc]):
            opt.step()
        hook.armed = False
    assert_model_follows_masters(model, opt)
    scheduler.step()
    assert opt.param_groups[0]["lr"] == lr / 4


class RaisingFilter(logging.Filter):
    """A logging filter with a bug (or a Ctrl-C) that fires on amp's overflow report."""

    def __init__(self, exc):
        super().__init__()
        self.exc = exc

    def filter(self, record):
        if "Gradient overflow" in record.getMessage():
            raise self.exc("the overflow report raised")
        return True


@pytest.mark.parametrize("exc", list(EXCEPTIONS))
@pytest.mark.parametrize("opt_name", ["Adam", "FusedAdam-fused-masters-kernel"])
def test_a_skipped_step_runs_no_hook_and_drops_its_grads_even_when_its_report_raises(opt_name, exc, cast_path):
    expected = reference(opt_name, cast_path, False)
    model, opt = build(opt_name, verbosity=1)
    hooks = [Raiser(EXCEPTIONS[exc]) for _ in range(4)]
    for hook in hooks:
        hook.armed = True
    handles = [opt.register_step_pre_hook(hooks[0]), opt.register_step_post_hook(hooks[1]),
               register_optimizer_step_pre_hook(hooks[2]), register_optimizer_step_post_hook(hooks[3])]
    with contextlib.ExitStack() as stack:
        for handle in handles:
            stack.enter_context(removing(handle))
        before = snapshot(opt)
        backward(model, opt, 0, poison=True)
        opt.step()  # skipped, as apex skipped it: the optimizer's step (and its hooks) never runs
        assert [h.calls for h in hooks] == [0, 0, 0, 0]
        assert all(torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(before, snapshot(opt)))
        opt.zero_grad()
        backward(model, opt, 0, poison=True)
        report = RaisingFilter(EXCEPTIONS[exc])
        logger = logging.getLogger("apexlite.amp")
        logger.addFilter(report)
        try:
            with pytest.raises(EXCEPTIONS[exc], match="the overflow report raised"):
                opt.step()
        finally:
            logger.removeFilter(report)
        assert all(m.grad is None for _, m in pairs(opt))  # the overflowed grads never reach a later step
    assert_model_follows_masters(model, opt)
    # no zero_grad here: whatever the skip left must not leak into the next step
    for index in range(3):
        clean_step(model, opt, index)
    for (p, m), (ref_p, ref_m) in zip(snapshot(opt), expected):
        assert torch.equal(p, ref_p) and torch.equal(m, ref_m)
