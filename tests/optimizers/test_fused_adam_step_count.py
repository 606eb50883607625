"""FusedAdam's step count (``step_count``): apex's per-group rule, against torch.optim.AdamW with apex's
count applied from outside, and torch's per-param rule, against torch.optim.AdamW itself, for params that
get grads on some steps only. When every param has a grad every step both agree with torch
(test_fused_adam_parity.py)."""
from __future__ import annotations

import copy
import io
from typing import Dict, List, Sequence

import pytest
import torch

from apexlite.optimizers import FusedAdam
from tests.optimizers.adam_helpers import IMPLEMENTATIONS, assert_state_matches, fp32_leaves, torch_adam

HYPER = dict(lr=5e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.01)
STEPS = 8
SHAPES = [(6, 5), (7,), (3, 4), (9,)]

# pattern -> for each param (by index), the steps at which it has a grad; params not named have one every
# step. The second group (index 3 alone) shows a group whose params all wait.
PATTERNS: Dict[str, Dict[int, Sequence[int]]] = {
    "a-branch-taken-sometimes": {1: (0, 3, 5)},
    "a-layer-unfrozen-later": {2: (4, 5, 6, 7)},
    "trained-frozen-trained": {0: (0, 1, 2, 6, 7)},
    "a-group-frozen-at-first": {3: (3, 4, 5, 6, 7)},
    "a-group-frozen-after-a-while": {3: (0, 1)},
    "nothing-at-the-first-step": {i: range(1, STEPS) for i in range(4)},
}


class ApexCountedAdamW:
    """torch.optim.AdamW stepped with apex's count: a param starting its state takes the group's count, and
    each step advances the counters of the params without a grad (apex/optimizers/fused_adam.py kept one
    count per group and used it for every param)."""

    def __init__(self, groups: List[List[torch.nn.Parameter]]) -> None:
        self.torch = torch_adam([{"params": g} for g in groups], True, **HYPER)
        self.counts = [0] * len(groups)

    def step(self) -> None:
        for index, group in enumerate(self.torch.param_groups):
            for p in group["params"]:
                state = self.torch.state[p]
                if p.grad is not None and not state:
                    state.update(step=torch.tensor(float(self.counts[index])), exp_avg=torch.zeros_like(p),
                                 exp_avg_sq=torch.zeros_like(p))
        idle = [self.torch.state[p] for g in self.torch.param_groups for p in g["params"]
                if p.grad is None and self.torch.state[p]]
        self.torch.step()
        for state in idle:
            state["step"] += 1
        self.counts = [c + 1 for c in self.counts]

    @property
    def state(self):
        return self.torch.state


def _groups(params: List[torch.nn.Parameter]) -> List[List[torch.nn.Parameter]]:
    return [params[:3], params[3:]]


def _run(pattern: Dict[int, Sequence[int]], ours, ours_params, ref, ref_params, steps=range(STEPS)) -> None:
    for step in steps:
        gen = torch.Generator().manual_seed(step)
        for index, (p, r) in enumerate(zip(ours_params, ref_params)):
            grad = torch.randn(p.shape, generator=gen)
            has = step in pattern.get(index, range(STEPS))
            p.grad, r.grad = (grad.to(p.device), grad.to(r.device)) if has else (None, None)
        ours.step()
        ref.step()


def _twins(step_count: str, implementation: str, flat_buffers: bool):
    init = [torch.randn(shape, generator=torch.Generator().manual_seed(i)) for i, shape in enumerate(SHAPES)]
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    ours = FusedAdam([{"params": g} for g in _groups(ours_params)], **HYPER, step_count=step_count,
                     implementation=implementation, flat_buffers=flat_buffers)
    ref = (ApexCountedAdamW(_groups(ref_params)) if step_count == "group"
           else torch_adam([{"params": g} for g in _groups(ref_params)], True, **HYPER))
    return ours, ours_params, ref, ref_params


def _assert_same(ours, ours_params, ref, ref_params) -> None:
    stepped = [(p, r) for p, r in zip(ours_params, ref_params) if ref.state[r]]
    assert [bool(ours.state.get(p)) for p in ours_params] == [bool(ref.state[r]) for r in ref_params]
    assert_state_matches(ours, [p for p, _ in stepped], ref, [r for _, r in stepped])
    assert all(torch.equal(p.detach(), r.detach()) for p, r in zip(ours_params, ref_params) if not ref.state[r])


@pytest.mark.parametrize("flat_buffers", [True, False], ids=["flat", "per-tensor"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("step_count", ["group", "param"])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_params_with_grads_on_some_steps_follow_their_rule(pattern, step_count, implementation, flat_buffers):
    twins = _twins(step_count, implementation, flat_buffers)
    _run(PATTERNS[pattern], *twins)
    _assert_same(*twins)


def test_apex_count_is_what_apex_gave_for_a_param_stepped_at_the_first_and_fourth_step():
    """apex's FusedAdam on a param with grads of 1 at steps 1 and 4 only (lr 0.1, from 1): 0.8219 (t=4 at the
    second update; torch's count, t=2, gives 0.8000)."""
    results = {}
    for step_count in ("group", "param"):
        steady, sometimes = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))
        opt = FusedAdam([steady, sometimes], lr=0.1, step_count=step_count)
        for step in range(1, 5):
            steady.grad = torch.ones(4)
            sometimes.grad = torch.ones(4) if step in (1, 4) else None
            opt.step()
        results[step_count] = round(sometimes[0].item(), 4), float(opt.state[sometimes]["step"])
    assert results == {"group": (0.8219, 4.0), "param": (0.8, 2.0)}


@pytest.mark.parametrize("pattern", ["a-group-frozen-at-first", "a-layer-unfrozen-later", "trained-frozen-trained"])
@pytest.mark.parametrize("flat_buffers", [True, False], ids=["flat", "per-tensor"])
def test_a_resumed_run_keeps_the_group_count(pattern, flat_buffers):
    """Saved part-way (a group that took steps while no param had state included) and loaded into a new
    optimizer, the run continues as the uninterrupted one; the checkpoint names each group's count in
    apex's key."""
    twins = _twins("group", "reference", flat_buffers)
    ours, ours_params, ref, ref_params = twins
    _run(PATTERNS[pattern], *twins, steps=range(3))
    saved = ours.state_dict()
    assert [group["step"] for group in saved["param_groups"]] == [3, 3]
    resumed = FusedAdam([{"params": g} for g in _groups(ours_params)], lr=1.0, flat_buffers=flat_buffers)
    resumed.load_state_dict(saved)
    _run(PATTERNS[pattern], resumed, ours_params, ref, ref_params, steps=range(3, STEPS))
    _assert_same(resumed, ours_params, ref, ref_params)


@pytest.mark.parametrize("flat_buffers", [True, False], ids=["flat", "per-tensor"])
def test_a_step_found_inf_skips_advances_no_counter(flat_buffers):
    """Under GradScaler's contract (found_inf set on the optimizer) a skipped step leaves every param, every
    counter, the idle ones included, and a waiting group's count as they were."""
    params = fp32_leaves([torch.randn(5), torch.randn(3), torch.randn(4)])
    opt = FusedAdam([{"params": params[:2]}, {"params": params[2:]}], **HYPER, flat_buffers=flat_buffers)
    for p in params[:2]:
        p.grad = torch.randn(p.shape)
    opt.step()
    params[1].grad = None
    opt.grad_scale, opt.found_inf = torch.ones(1), torch.ones(1)
    before = [p.detach().clone() for p in params]
    opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert [float(opt.state[p]["step"]) for p in params[:2]] == [1.0, 1.0]
    assert float(opt.param_groups[1]["step"]) == 1.0  # the waiting group counted the first step only
    opt.found_inf = torch.zeros(1)
    opt.step()
    assert [float(opt.state[p]["step"]) for p in params[:2]] == [2.0, 2.0]
    assert opt.state_dict()["param_groups"][1]["step"] == 2


@pytest.mark.parametrize("flat_buffers", [True, False], ids=["flat", "per-tensor"])
def test_a_groups_step_reads_its_count_as_apex_kept_it(flat_buffers):
    """``param_groups[i]["step"]`` is the group's count, an int, as apex's FusedAdam kept it (logging and
    warm-up code read it): through idle params, a group frozen at first, copies, pickles and a load."""
    steady, sometimes, frozen = (torch.nn.Parameter(torch.ones(2)) for _ in range(3))
    opt = FusedAdam([{"params": [steady, sometimes]}, {"params": [frozen]}], lr=0.1, flat_buffers=flat_buffers)
    assert [group["step"] for group in opt.param_groups] == [0, 0]
    for step in range(1, 4):
        steady.grad, sometimes.grad = torch.ones(2), (torch.ones(2) if step == 1 else None)
        opt.step()
    assert [group["step"] for group in opt.param_groups] == [3, 3]
    assert type(opt.param_groups[0]["step"]) is int and "step" not in opt.param_groups[0]
    copied = copy.deepcopy(opt)
    buffer = io.BytesIO()
    torch.save(opt, buffer)
    buffer.seek(0)
    unpickled = torch.load(buffer, weights_only=False)
    loaded = FusedAdam([{"params": [steady, sometimes]}, {"params": [frozen]}], lr=0.1, flat_buffers=flat_buffers)
    loaded.load_state_dict(opt.state_dict())
    for other in (copied, unpickled, loaded):
        assert [group["step"] for group in other.param_groups] == [3, 3]
    steady.grad = torch.ones(2)
    copied.step()
    assert [group["step"] for group in copied.param_groups] == [4, 4]
    assert [group["step"] for group in opt.param_groups] == [3, 3]
    with pytest.raises(KeyError, match="not_a_key"):
        opt.param_groups[0]["not_a_key"]


def test_an_unknown_step_count_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="step_count must be 'group'.*or 'param'.*got 'torch'"):
        FusedAdam([torch.nn.Parameter(torch.ones(2))], step_count="torch")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("flat_buffers", [True, False], ids=["flat", "per-tensor"])
@pytest.mark.parametrize("pattern", ["a-branch-taken-sometimes", "a-group-frozen-at-first", "trained-frozen-trained"])
def test_the_group_count_on_a_gpu_matches_the_cpu(pattern, flat_buffers):
    """The kernel on CUDA with apex's count (idle counters advanced on the device) against the CPU run."""
    init = [torch.randn(shape, generator=torch.Generator().manual_seed(i)) for i, shape in enumerate(SHAPES)]
    cpu_params, gpu_params = fp32_leaves(init), fp32_leaves([t.cuda() for t in init])
    cpu = FusedAdam([{"params": g} for g in _groups(cpu_params)], **HYPER, implementation="reference")
    gpu = FusedAdam([{"params": g} for g in _groups(gpu_params)], **HYPER, flat_buffers=flat_buffers)
    _run(PATTERNS[pattern], gpu, gpu_params, cpu, cpu_params)
    for p, r in zip(gpu_params, cpu_params):
        torch.testing.assert_close(p.detach().cpu(), r.detach(), rtol=1e-5, atol=1e-6)
        assert float(gpu.state[p]["step"]) == float(cpu.state[r]["step"])


def test_under_a_grad_scaler_an_overflowing_step_counts_for_no_param():
    """With torch.amp.GradScaler: the step whose grads overflow advances no counter, idle ones included, and
    the next steps count on from there (apex's amp skipped its optimizer's step() on overflow)."""
    model = torch.nn.ModuleDict({"always": torch.nn.Linear(3, 3), "sometimes": torch.nn.Linear(3, 3)})
    opt = FusedAdam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    skipped = []
    for step in range(6):
        x = torch.randn(2, 3)
        if step == 3:
            x[0, 0] = float("inf")
        out = model["always"](x)
        if step in (0, 4):
            out = model["sometimes"](out)
        opt.zero_grad()
        scaler.scale(out.pow(2).mean()).backward()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < scale)
    assert skipped == [False, False, False, True, False, False]
    assert [float(opt.state[p]["step"]) for p in model.parameters()] == [5.0] * 4
