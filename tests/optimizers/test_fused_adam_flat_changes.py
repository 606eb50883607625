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


@pytest.mark.parametrize("implementation", IMPLS)
def test_a_param_without_grad_is_skipped_and_the_buffers_follow(grad_pass, implementation, monkeypatch):
    runs = twins(implementation=implementation)
    calls = count_calls(monkeypatch)
    for step in range(5):
        grads = grads_for(runs[0][0], torch.float32, step)
        for params, opt in runs:
            set_grads(params, grads)
            if step == 1:
                params[2].grad = None
            opt.step()
    assert_same(*runs, exact=implementation == "kernel")
    flat_steps = [float(runs[0][1].state[p]["step"]) for p in runs[0][0]]
    assert flat_steps == [5.0, 5.0, 4.0, 5.0, 5.0]
    # steps 0, 2, 3, 4 flat (two sets after the rebuild: 4 and 5 steps taken); step 1 per tensor. (The grads
    # are fresh every step: moved into a grad buffer, or, on apexlite's kernel, read where they are.)
    assert calls["flat"] + calls["read"] == 1 + 0 + 2 + 2 + 2


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


# change -> flat calls of steps 2 and 3 (a param whose state was emptied restarts at step 0: its own set)
STATE_CHANGES = {"entry": 1, "state-dict": 2, "clear": 1, "new-map": 1}


@pytest.mark.parametrize("change", sorted(STATE_CHANGES))
def test_replaced_state_is_what_the_next_step_uses(grad_pass, change, monkeypatch):
    runs = twins()
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
    assert calls["flat"] + calls["read"] == 2 + 2 * STATE_CHANGES[change]  # the flat path resumes at once


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
