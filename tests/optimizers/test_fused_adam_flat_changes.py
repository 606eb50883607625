"""FusedAdam's flat buffers when what they hold changes: a param without a grad, a model cast after steps,
replaced state, edited param groups, a checkpoint loaded mid-run, shared memory, a group that keeps
changing. Each case runs next to ``FusedAdam(flat_buffers=False)`` (test_fused_adam_flat.py says why)
and with apexlite._C.flat_grads and its Python twin.
"""
from __future__ import annotations

import copy
import logging
from collections import defaultdict

import pytest
import torch

from apexlite.optimizers import FusedAdam, _flat_buffers
from tests.optimizers.adam_helpers import set_grads
from tests.optimizers.flat_helpers import (  # noqa: F401 (grad_pass: a fixture)
    HYPER, IMPLS, assert_same, count_calls, grad_pass, grads_for, make_params, twins,
)


# step count -> the skipping param's count after 5 steps, and the flat calls of steps 2-4 (after the rebuild)
SKIPPED_STEP = {"group": (5.0, 1), "param": (4.0, 2)}


@pytest.mark.parametrize("implementation", IMPLS)
@pytest.mark.parametrize("step_count", sorted(SKIPPED_STEP))
def test_a_param_without_grad_is_skipped_and_the_buffers_follow(grad_pass, implementation, step_count, monkeypatch):
    runs = twins(implementation=implementation, step_count=step_count)
    calls = count_calls(monkeypatch)
    for step in range(5):
        grads = grads_for(runs[0][0], torch.float32, step)
        for params, opt in runs:
            set_grads(params, grads)
            if step == 1:
                params[2].grad = None
            opt.step()
    assert_same(*runs, exact=implementation == "kernel")
    skipped_count, sets = SKIPPED_STEP[step_count]
    flat_steps = [float(runs[0][1].state[p]["step"]) for p in runs[0][0]]
    assert flat_steps == [5.0, 5.0, skipped_count, 5.0, 5.0]
    # steps 0, 2, 3, 4 flat (after the rebuild one set, or under torch's count two: 4 and 5 steps taken); step 1
    # per tensor. (The grads are fresh every step: moved into a grad buffer, or, on apexlite's kernel, read in place.)
    assert calls["flat"] + calls["read"] == 1 + 0 + 3 * sets


def test_model_cast_after_steps_continues_like_the_per_tensor_path(grad_pass):
    runs = twins()
    for step in range(4):
        grads = grads_for(runs[0][0], torch.float32 if step < 2 else torch.bfloat16, step)
        for params, opt in runs:
            if step == 2:  # what model.to(torch.bfloat16) does, then amp's switch to master weights
                saved = {p: p.detach().clone() for p in params}
                for p in params:
                    p.data = p.data.to(torch.bfloat16)
                opt.enable_master_weights(saved)
            set_grads(params, grads)
            opt.step()
    assert_same(*runs)


# change -> flat calls of steps 2 and 3 (a param whose state was emptied restarts from the group's count, as
# apex; under torch's count at step 0, in its own set)
STATE_CHANGES = {"entry": 1, "state-dict": {"group": 1, "param": 2}, "clear": 1, "new-map": 1}


@pytest.mark.parametrize("step_count", ["group", "param"])
@pytest.mark.parametrize("change", sorted(STATE_CHANGES))
def test_replaced_state_is_what_the_next_step_uses(grad_pass, change, step_count, monkeypatch):
    runs = twins(step_count=step_count)
    calls = count_calls(monkeypatch)
    for step in range(4):
        grads = grads_for(runs[0][0], torch.float32, step)
        for params, opt in runs:
            if step == 2:
                if change == "entry":
                    opt.state[params[0]]["exp_avg"] = torch.full_like(params[0], 0.5)
                elif change == "state-dict":
                    opt.state[params[1]] = {}
                elif change == "clear":
                    opt.state.clear()
                else:
                    opt.state = defaultdict(dict)
            set_grads(params, grads)
            opt.step()
    assert_same(*runs)
    sets = STATE_CHANGES[change]
    sets = sets[step_count] if isinstance(sets, dict) else sets
    assert calls["flat"] + calls["read"] == 2 + 2 * sets  # the flat path resumes at once


def test_params_list_edited_in_place_and_new_group(grad_pass):
    runs = twins()
    extra = [make_params(shapes=[(4,), (3, 3)], seed=5) for _ in runs]
    for step in range(4):
        for (params, opt), more in zip(runs, extra):
            if step == 1:
                opt.param_groups[0]["params"].append(more[0])
            if step == 2:
                opt.add_param_group({"params": [more[1]], "lr": 3e-3})
            set_grads(params + more, grads_for(params + more, torch.float32, step))
            opt.step()
    assert_same((runs[0][0] + extra[0], runs[0][1]), (runs[1][0] + extra[1], runs[1][1]))


def test_loading_a_checkpoint_mid_run(grad_pass, monkeypatch):
    runs = twins()
    calls = count_calls(monkeypatch)
    for step in range(5):
        grads = grads_for(runs[0][0], torch.float32, step)
        for index, (params, opt) in enumerate(runs):
            if step == 3:
                opt.load_state_dict(copy.deepcopy(runs[1][1].state_dict()))  # both take the same checkpoint
            set_grads(params, grads)
            opt.step()
    assert_same(*runs)
    assert calls["flat"] + calls["read"] == 5  # every step of the flat run, the one after the load included


def test_params_sharing_memory_stay_where_they_are():
    base = torch.randn(20)
    whole = torch.nn.Parameter(base.clone())
    tied = [torch.nn.Parameter(torch.empty(0)) for _ in range(2)]
    storage = torch.randn(10)
    for index, p in enumerate(tied):  # two params on one storage (e.g. tied through .data)
        p.data = storage[index * 5:(index + 1) * 5]
    params = [whole] + tied
    where = [p.data_ptr() for p in params]
    opt, ref = FusedAdam(params, **HYPER), FusedAdam([torch.nn.Parameter(p.detach().clone()) for p in params],
                                                     flat_buffers=False, **HYPER)
    for step in range(3):
        grads = grads_for(params, torch.float32, step)
        set_grads(params, grads)
        set_grads(ref.param_groups[0]["params"], grads)
        opt.step()
        ref.step()
    assert [p.data_ptr() for p in tied] == where[1:] and whole.data_ptr() != where[0]
    assert_same((params, opt), (ref.param_groups[0]["params"], ref))


def test_grads_that_are_views_of_another_buffer_are_not_moved(grad_pass):
    runs = twins()
    for step in range(3):
        grads = grads_for(runs[0][0], torch.float32, step)
        for params, opt in runs:
            bucket = torch.cat([g.flatten() for g in grads])  # as DDP's gradient_as_bucket_view
            offset = 0
            for p in params:
                p.grad = bucket[offset:offset + p.numel()].view(p.shape)
                offset += p.numel()
            opt.step()
            assert all(p.grad._base is bucket for p in params)
    assert_same(*runs)


def _lay_out(params, values, arrangement):
    """Gives each param the grad ``values[i]``, in the memory ``arrangement`` names (GRAD_MEMORY)."""
    sizes = [p.numel() for p in params]
    if arrangement == "two-grads-on-one-memory":
        bucket = torch.cat([v.flatten() for v in values])
        for p, v, start in zip(params, values, [0, 30, 35, 32, 36]):  # params 1 and 3 overlap at element 32
            p.grad = bucket[start:start + p.numel()].view(p.shape)
        return
    order = list(range(len(params)))[::-1 if arrangement == "bucket-in-reverse-order" else 1]
    bucket = torch.cat([values[i].flatten() for i in order])
    start = 0
    for i in order:
        params[i].grad = bucket[start:start + sizes[i]].view(params[i].shape)
        start += sizes[i]


# arrangement -> the flat run's calls in 3 steps on apexlite's kernel: each set reads grads that cannot move
# where they are, unless two grads share an element (then per tensor).
# torch's fused ops need one grad buffer: there such grads always go per tensor.
GRAD_MEMORY = {
    "views-of-one-bucket": {"flat": 0, "read": 3, "lists": 0},  # DDP's gradient_as_bucket_view
    "bucket-in-reverse-order": {"flat": 0, "read": 3, "lists": 0},
    "two-grads-on-one-memory": {"flat": 0, "read": 0, "lists": 3},
}


# Grads sharing an element and unscaled in place have no one right answer (each write changes another's
# input, in whatever order the path takes them): that arrangement is compared unscaled only.
CANNOT_MOVE_CASES = [(arrangement, scaled) for arrangement in sorted(GRAD_MEMORY) for scaled in (False, True)
                     if not (scaled and arrangement == "two-grads-on-one-memory")]


@pytest.mark.parametrize("arrangement, scaled", CANNOT_MOVE_CASES,
                         ids=[f"{a}-{'grad-scaler' if s else 'unscaled'}" for a, s in CANNOT_MOVE_CASES])
@pytest.mark.parametrize("implementation", IMPLS)
def test_grads_that_cannot_move_are_read_where_they_are(grad_pass, monkeypatch, implementation, arrangement, scaled):
    """Views of another tensor (the unbound grads of a stacked tensor, a DDP bucket's) are read in place by
    apexlite's kernels, never moved or copied; the per-tensor path takes them on torch's fused ops, and
    whenever two grads share memory. The params, the state and the grads a GradScaler step leaves (unscaled
    in place) match flat_buffers=False's."""
    runs = twins(implementation=implementation)
    calls = count_calls(monkeypatch)
    for step in range(3):
        values = grads_for(runs[0][0], torch.float32, step)
        for params, opt in runs:
            _lay_out(params, [v * 64.0 if scaled else v for v in values], arrangement)
            bases = [p.grad._base for p in params]
            if scaled:
                scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
                scaler.scale(torch.ones(()))
                scaler.step(opt)
            else:
                opt.step()
            assert all(p.grad._base is base for p, base in zip(params, bases)), "a grad was moved"
        for p, r in zip(*(params for params, _ in runs)):
            torch.testing.assert_close(p.grad, r.grad, rtol=0, atol=0)
    assert_same(*runs, exact=implementation == "kernel")
    expected = GRAD_MEMORY[arrangement] if implementation == "kernel" else {"flat": 0, "read": 0, "lists": 3}
    assert calls == dict(expected, lists=expected["lists"] + 3)  # (+ flat_buffers=False's, per tensor)


def test_a_lazily_negated_grad_is_refused_not_read_as_its_memory(grad_pass):
    """A grad that is torch._neg_view of its values cannot be read in place (its memory holds the negated
    values): the set goes per tensor, where torch refuses such grads loudly, as for flat_buffers=False."""
    for params, opt in twins():
        set_grads(params, grads_for(params, torch.float32, 0))
        params[2].grad = torch._neg_view(-params[2].grad)
        before = [p.detach().clone() for p in params]
        with pytest.raises(RuntimeError, match="negation"):
            opt.step()
        assert all(torch.equal(p, b) for p, b in zip(params, before))


def test_a_group_that_keeps_changing_stays_on_the_per_tensor_path(grad_pass, caplog):
    runs = twins()
    with caplog.at_level(logging.INFO, logger="apexlite"):
        for step in range(2 * _flat_buffers.MAX_REBUILDS + 6):
            grads = grads_for(runs[0][0], torch.float32, step)
            for params, opt in runs:
                set_grads(params, grads)
                params[step % 2].grad = None  # a different param misses each step
                opt.step()
    assert_same(*runs)
    said = [r for r in caplog.records if "keeps the per-tensor path" in r.getMessage()]
    assert len(said) == 1
