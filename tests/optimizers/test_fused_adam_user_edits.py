"""What users do around FusedAdam that its flat buffers must not get wrong: a step under torch.compile, params
in shared memory (Hogwild), a param listed twice (refused), a step counter edited in place, and what FusedAdam does not
implement (torch's maximize) or must refuse before it changes anything (a bad add_param_group). Each against
torch.optim.Adam on the same params and grads."""
from __future__ import annotations

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
