"""apexlite._C.GradList (csrc/torch/grad_list.cpp): the grads the C++ grad check hands FusedAdam's flat step when
it reads them where they are, held as C++ tensors (no Python object per autograd-made grad).

Checked: the check answers READ_IN_PLACE with a GradList of one entry per member, each the member's own grad
(the same tensor object); it holds one reference per grad and gives it back when freed; Python cannot make
one; and the direct op call takes it as it takes a tuple, bit for bit.
"""
from __future__ import annotations

import pytest
import torch

from apexlite.optimizers import FusedAdam, _flat_grads
from tests.optimizers.flat_helpers import HYPER, grads_for, make_params

pytestmark = pytest.mark.skipif(_flat_grads._native("flat_grads") is None, reason="apexlite's library not loaded")


def _checked_set():
    """(params, their flat set, the native check's answer) for grads that are views of one bucket."""
    params = make_params()
    opt = FusedAdam(params, implementation="kernel", **HYPER)
    for step in range(2):
        bucket = torch.cat([g.flatten() for g in grads_for(params, torch.float32, step)])
        start = 0
        for p in params:
            p.grad = bucket[start:start + p.numel()].view(p.shape)
            start += p.numel()
        if step == 0:
            opt.step()
    group = opt.param_groups[0]
    layout = opt._flat._layouts[id(group)][1]
    flat_set = layout.sets[0]
    answer = _flat_grads._native("flat_grads")(
        group["params"], layout.known, flat_set.members, flat_set.masters, flat_set.param_spans, flat_set.offsets,
        flat_set.grad_like, flat_set.weights.numel(), flat_set.grad_start, 0, _flat_grads.READ_FRESH)
    return params, flat_set, answer


def test_the_check_hands_over_each_member_s_own_grad():
    params, flat_set, (status, fresh, grads) = _checked_set()
    assert status == _flat_grads.READ_IN_PLACE and fresh == len(params)
    assert type(grads).__name__ == "GradList" and len(grads) == len(flat_set.members)
    assert all(held is member.grad for held, member in zip(grads.tensors(), flat_set.members))


def test_it_holds_one_reference_per_grad_and_gives_it_back():
    params, _, (_, _, grads) = _checked_set()
    held = [p.grad._use_count() for p in params]
    del grads
    assert [p.grad._use_count() for p in params] == [n - 1 for n in held]


def test_python_cannot_make_one():
    _, _, (_, _, grads) = _checked_set()
    with pytest.raises(TypeError):
        type(grads)()


def test_the_direct_op_call_takes_it_as_it_takes_a_tuple():
    from apexlite._native.loader import native_module

    results = []
    for as_tuple in (False, True):
        _, flat_set, (_, _, grads) = _checked_set()
        handed = grads.tensors() if as_tuple else grads
        native_module().fused_adam_flat_grad_list(flat_set.weights, handed, flat_set.offsets, flat_set.exp_avg,
                                                  flat_set.exp_avg_sq, flat_set.steps, flat_set.copies, 1e-3, 0.9,
                                                  0.999, 1e-8, 0.01, True, True, None, None, False)
        results.append([flat_set.weights.clone(), flat_set.exp_avg.clone(), flat_set.exp_avg_sq.clone()])
    assert all(torch.equal(a, b) for a, b in zip(*results))
    with pytest.raises(TypeError, match="a tuple of tensors or a GradList, not list"):
        native_module().fused_adam_flat_grad_list(flat_set.weights, list(grads.tensors()), flat_set.offsets,
                                                  flat_set.exp_avg, flat_set.exp_avg_sq, flat_set.steps,
                                                  flat_set.copies, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, True, None,
                                                  None, False)
