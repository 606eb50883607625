"""What users do around FusedAdam that its flat buffers must not get wrong: a step under torch.compile, params
in shared memory (Hogwild), a param listed twice (refused), a step counter edited in place, and what FusedAdam does not
implement (torch's maximize) or must refuse before it changes anything (a bad add_param_group). Each against
torch.optim.Adam on the same params and grads."""
from __future__ import annotations

import copy

import pytest
import torch

from apexlite._native import loader as _ext
from apexlite.optimizers import FusedAdam
from tests._helpers.torch_snapshot import warm_up_torch_compile

warm_up_torch_compile()  # torch's first compile wraps torch.jit.trace, which the patch guard would blame on a test

FLAT = [True, False]


def _two_params():
    return [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]


def _pair(flat_buffers, make=_two_params):
    """The same params twice: ours under FusedAdam (Adam mode), theirs under torch.optim.Adam."""
    ours, theirs = (torch.manual_seed(0) and make(), torch.manual_seed(0) and make())
    return (ours, FusedAdam(ours, lr=1e-2, adam_w_mode=False, flat_buffers=flat_buffers),
            theirs, torch.optim.Adam(theirs, lr=1e-2))


def _grads(params, step):
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(p.shape, generator=gen) for p in params]


def _step(params, optimizer, grads, run=None):
    for param, grad in zip(params, grads):
        param.grad = grad.clone()
    (run or optimizer.step)()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("implementation", ["kernel", "torch"])
def test_a_step_under_torch_compile_trains_as_the_eager_step(backend, implementation):
    """Dynamo would trace the flat buffers' bookkeeping and drop its state writes: step() runs eagerly."""
    if implementation == "kernel" and not _ext.kernels_available("cpu"):
        pytest.skip("compiled CPU kernel not built")
    torch._dynamo.reset()
    ours, opt, theirs, reference = _pair(True)
    opt.implementation = implementation
    compiled = torch.compile(opt.step, backend=backend)
    for step in range(4):
        grads = _grads(ours, step)
        _step(ours, opt, grads, compiled)
        _step(theirs, reference, grads)
    for mine, torchs in zip(ours, theirs):
        torch.testing.assert_close(mine, torchs, rtol=0, atol=1e-6)
        assert float(opt.state[mine]["step"]) == 4.0


def test_params_in_shared_memory_stay_there():
    """model.share_memory() (Hogwild): a flat buffer would hold the param's values in this process only."""
    model = torch.nn.Linear(4, 3)
    model.share_memory()
    pointers = [p.data_ptr() for p in model.parameters()]
    optimizer = FusedAdam(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
    assert all(p.is_shared() for p in model.parameters())
    assert [p.data_ptr() for p in model.parameters()] == pointers


@pytest.mark.parametrize("later", [False, True])
def test_a_param_listed_twice_is_refused(later):
    """torch steps it twice and warns it will be an error; a fused kernel would update it twice at once."""
    shared, other = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(3))
    with pytest.raises(ValueError, match=r"lists one param twice \(entries 0 and 2, shape \(4,\)\)"):
        if later:
            FusedAdam([other]).add_param_group({"params": [shared, torch.nn.Parameter(torch.randn(2)), shared]})
        else:
            FusedAdam([shared, other, shared])


@pytest.mark.parametrize("member", [0, 1])
@pytest.mark.parametrize("flat_buffers", FLAT)
def test_a_step_counter_reset_in_place_restarts_that_params_bias_correction(member, flat_buffers):
    ours, opt, theirs, reference = _pair(flat_buffers)
    for step in range(6):
        if step == 3:
            opt.state[ours[member]]["step"].zero_()
            reference.state[theirs[member]]["step"].zero_()
        grads = _grads(ours, step)
        _step(ours, opt, grads)
        _step(theirs, reference, grads)
    for mine, torchs in zip(ours, theirs):
        torch.testing.assert_close(mine, torchs, rtol=0, atol=1e-6)
    assert [float(opt.state[p]["step"]) for p in ours] == [float(reference.state[p]["step"]) for p in theirs]


def test_a_checkpoint_of_torchs_maximize_is_refused():
    params = [torch.nn.Parameter(torch.randn(3))]
    reference = torch.optim.AdamW(params, maximize=True)
    params[0].grad = torch.ones(3)
    reference.step()
    optimizer = FusedAdam(params)
    with pytest.raises(RuntimeError, match="maximize=True .* FusedAdam does not implement"):
        optimizer.load_state_dict(reference.state_dict())


def test_maximize_set_on_a_group_is_refused_at_the_step_before_anything_changes():
    params = [torch.nn.Parameter(torch.randn(3))]
    before = params[0].detach().clone()
    optimizer = FusedAdam(params)
    optimizer.param_groups[0]["maximize"] = True
    params[0].grad = torch.ones(3)
    with pytest.raises(RuntimeError, match="a param group has maximize=True"):
        optimizer.step()
    assert torch.equal(params[0], before)


def test_a_refused_add_param_group_adds_nothing():
    first, second = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    optimizer = FusedAdam([first], lr=1e-2)
    with pytest.raises(ValueError, match="Invalid learning rate: -1.0"):
        optimizer.add_param_group({"params": [second], "lr": -1.0})
    assert len(optimizer.param_groups) == 1
    optimizer.add_param_group({"params": [second], "lr": 1e-3})  # the corrected group goes in
    assert [group["lr"] for group in optimizer.param_groups] == [1e-2, 1e-3]


@pytest.mark.parametrize("where", ["same group", "another group"])
@pytest.mark.parametrize("flat_buffers", FLAT)
def test_a_param_listed_twice_by_editing_a_group_is_refused_at_the_step(where, flat_buffers):
    """group['params'] edited after the group was added: refused before anything changes (the flat path
    counted it wrongly and the per-tensor path updated it twice at once)."""
    shared, other = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(3))
    optimizer = FusedAdam([{"params": [shared]}, {"params": [other]}], flat_buffers=flat_buffers)
    shared.grad, other.grad = torch.ones(4), torch.ones(3)
    optimizer.step()
    optimizer.param_groups[0 if where == "same group" else 1]["params"].append(shared)
    before = [shared.detach().clone(), other.detach().clone()]
    expected = "twice in param group 0" if where == "same group" else "in param groups 0 and 1"
    with pytest.raises(ValueError, match=f"a param \\(shape \\(4,\\)\\) is listed {expected}"):
        optimizer.step()
    assert torch.equal(shared, before[0]) and torch.equal(other, before[1])


def test_amsgrad_set_on_a_group_is_refused_at_the_step():
    """The constructor refuses amsgrad; a group given it later trained plain Adam without a word."""
    params = [torch.nn.Parameter(torch.randn(3))]
    optimizer = FusedAdam(params)
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.randn(2))], "amsgrad": True})
    params[0].grad = torch.ones(3)
    with pytest.raises(RuntimeError, match="a param group has amsgrad=True, which FusedAdam does not implement"):
        optimizer.step()


def test_params_on_the_meta_device_are_refused_with_how_to_materialise_them():
    with torch.device("meta"):
        layer = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"shape \(4, 4\) is on the meta device .*to_empty"):
        FusedAdam(layer.parameters())


@pytest.mark.parametrize("flat_buffers", FLAT)
def test_a_param_given_another_memory_layout_after_steps_trains_on(flat_buffers):
    """model.to(memory_format=torch.channels_last) after the first step: the state follows the new layout
    (the kernel refused the step: 'exp_avgs[0] has strides ... but params[0] has ...')."""
    make = lambda: [torch.nn.Parameter(torch.randn(3, 3, 3, 3)), torch.nn.Parameter(torch.randn(3))]  # noqa: E731
    ours, opt, theirs, reference = _pair(flat_buffers, make)
    for step in range(5):
        if step == 2:
            for param in (ours[0], theirs[0]):
                param.data = param.data.contiguous(memory_format=torch.channels_last)
        grads = [g.contiguous(memory_format=torch.channels_last) if g.dim() == 4 and step >= 2 else g
                 for g in _grads(ours, step)]
        _step(ours, opt, grads)
        _step(theirs, reference, grads)
    for mine, torchs in zip(ours, theirs):
        torch.testing.assert_close(mine, torchs, rtol=0, atol=1e-6)
    assert ours[0].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("flat_buffers", FLAT)
@pytest.mark.parametrize("edit", ["float64 exp_avg_sq", "column-major exp_avg", "int64 step", "shaped step"])
def test_state_entries_replaced_by_the_user_are_taken_as_torch_takes_them(edit, flat_buffers):
    """A state entry replaced by hand (its values kept, another dtype or layout) trains on as with torch."""
    make = lambda: [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]  # noqa: E731
    ours, opt, theirs, reference = _pair(flat_buffers, make)
    for step in range(5):
        if step == 2:
            for optimizer, param in ((opt, ours[0]), (reference, theirs[0])):
                state = optimizer.state[param]
                if edit == "float64 exp_avg_sq":
                    state["exp_avg_sq"] = state["exp_avg_sq"].double()
                elif edit == "column-major exp_avg":
                    state["exp_avg"] = state["exp_avg"].t().contiguous().t()
                elif optimizer is opt:  # (torch keeps its own step format; the count is what matters)
                    count = int(state["step"])
                    state["step"] = torch.tensor(count) if edit == "int64 step" else torch.tensor([float(count)])
        grads = _grads(ours, step)
        _step(ours, opt, grads)
        _step(theirs, reference, grads)
    for mine, torchs in zip(ours, theirs):
        torch.testing.assert_close(mine, torchs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("tie_at", [0, 2])
@pytest.mark.parametrize("flat_buffers", FLAT)
def test_weights_tied_through_data_train_as_torchs_loop_adam_trains_them(tie_at, flat_buffers):
    """`b.weight.data = a.weight.data` (old-style tying), before the first step or mid-run: both params step
    the one memory, one after the other, as torch's for-loop Adam does. A flat-buffer rebuild gave each its own
    copy again (0.027 apart after 3 steps), and one kernel call over both raced with itself."""
    torch.manual_seed(0)
    first = torch.nn.Sequential(torch.nn.Linear(6, 6, bias=False), torch.nn.Tanh(), torch.nn.Linear(6, 6, bias=False))
    second = copy.deepcopy(first)
    ours = FusedAdam(first.parameters(), lr=1e-2, flat_buffers=flat_buffers)
    theirs = torch.optim.AdamW(second.parameters(), lr=1e-2, weight_decay=0.0, foreach=False)
    for step in range(6):
        for model, optimizer in ((first, ours), (second, theirs)):
            if step == tie_at:
                model[2].weight.data = model[0].weight.data
            optimizer.zero_grad()
            model(torch.randn(3, 6, generator=torch.Generator().manual_seed(step))).square().mean().backward()
            optimizer.step()
        torch.testing.assert_close(first[0].weight, second[0].weight, rtol=0, atol=1e-6)
    assert first[0].weight.data_ptr() == first[2].weight.data_ptr()


@pytest.mark.parametrize("flat_buffers", FLAT)
def test_params_that_partly_overlap_in_memory_step_one_after_the_other(flat_buffers):
    """`p2.data = base[8000:]` beside `p1.data = base[:40000]`: the kernel once told shared memory by equal start
    addresses only, stepped the two at once on its threads, and the result changed from run to run."""
    def run(make_optimizer):
        torch.manual_seed(1)
        base = torch.randn(48000)
        params = [torch.nn.Parameter(torch.empty(0)), torch.nn.Parameter(torch.empty(0))]
        params[0].data, params[1].data = base[:40000], base[8000:]
        optimizer = make_optimizer(params)
        for step in range(3):
            _step(params, optimizer, _grads(params, step))
        return base

    reference = run(lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0, foreach=False))
    for _ in range(3):
        ours = run(lambda params: FusedAdam(params, lr=1e-2, flat_buffers=flat_buffers))
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)


GROWN = {"a larger tensor": lambda data: torch.randn(7), "a shorter view": lambda data: data[:3]}


@pytest.mark.parametrize("implementation", ["kernel", "torch", "reference"])
@pytest.mark.parametrize("change", list(GROWN))
@pytest.mark.parametrize("flat_buffers", FLAT)
def test_a_param_whose_data_changes_size_is_refused_until_its_state_is_dropped(flat_buffers, change, implementation):
    """A param's .data replaced by one of another size after a step: torch's Adam refuses it (a size mismatch);
    FusedAdam once ran torch's fused op on the old-size moments (writing past their end) or, on the flat buffers,
    kept stepping the old slot. Refused before anything changes; with its state dropped it trains on as a fresh
    torch.optim.AdamW param."""
    if implementation == "kernel" and not _ext.kernels_available("cpu"):
        pytest.skip("compiled CPU kernel not built")
    torch.manual_seed(0)
    resized, other = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(3))
    opt = FusedAdam([resized, other], lr=1e-2, step_count="param", flat_buffers=flat_buffers,
                    implementation=implementation)
    _step([resized, other], opt, _grads([resized, other], 0))
    resized.data = GROWN[change](resized.data)
    before = [resized.detach().clone(), other.detach().clone()]
    with pytest.raises(RuntimeError, match=r"shape \(5,\): its .data was replaced by a tensor of another shape"):
        _step([resized, other], opt, _grads([resized, other], 1))
    assert all(torch.equal(kept, now) for kept, now in zip(before, [resized, other]))
    del opt.state[resized]
    fresh = torch.nn.Parameter(resized.detach().clone())
    reference = torch.optim.AdamW([fresh], lr=1e-2, weight_decay=0.0, foreach=False)
    for step in range(2, 5):
        grads = _grads([resized, other], step)
        _step([resized, other], opt, grads)
        _step([fresh], reference, grads[:1])
    torch.testing.assert_close(resized, fresh, rtol=0, atol=1e-6)
