"""FusedAdam's per-step grad checks and zero_grad's on a set of 1,200 members: the compiled checks must answer as
their Python twins do, bump exactly the same versions, and step exactly as the per-tensor path, wherever in the
set (the first member, the middle, the last) a grad or param is not as the last step left it; on one intra-op
thread and on two, since the answers must not depend on torch's thread count (the scans once ran in parts on
those threads, and the positions are that version's part edges).
"""
from __future__ import annotations

import pytest
import torch

from apexlite.optimizers import FusedAdam, _flat_grads
from tests.optimizers.flat_helpers import HYPER, assert_same, grads_for, make_params, twins

MEMBERS = 1_200
SHAPES = [(2 + index % 3,) for index in range(MEMBERS)]
POSITIONS = [0, 255, 599, 600, 601, MEMBERS - 1]


def _fresh(params, masters, at):
    params[at].grad = params[at].grad.clone()


def _missing(params, masters, at):
    params[at].grad = None


def _moved(params, masters, at):
    params[at].data = params[at].data.clone()


def _master_grad(params, masters, at):
    masters[at].grad = torch.zeros_like(masters[at])


# change -> (what it does to member `at`, param dtype, master_weights)
CHANGES = {
    "fresh grad": (_fresh, torch.float32, False),
    "missing grad": (_missing, torch.float32, False),
    "moved param": (_moved, torch.float32, False),
    "master grad": (_master_grad, torch.bfloat16, True),
}


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _native(name):
    function = _flat_grads._native(name)
    if function is None:
        pytest.skip("apexlite's compiled library is not loaded")
    return function


def _built(dtype, master_weights, seed=0):
    """Params and a FusedAdam whose first step built the set and moved the grads into its grad buffer."""
    params = make_params(dtype, SHAPES, seed)
    opt = FusedAdam(params, master_weights=master_weights, **HYPER)
    for p, g in zip(params, grads_for(params, dtype, 1)):
        p.grad = g
    opt.step()
    flat_set = opt._flat._layouts[id(opt.param_groups[0])][1].sets[0]
    args = (opt.param_groups[0]["params"], tuple(params), flat_set.members, flat_set.masters, flat_set.param_spans,
            flat_set.offsets, flat_set.grad_like, flat_set.weights.numel(), flat_set.grad_start)
    assert len(flat_set.members) == MEMBERS
    return params, opt, flat_set, args


def _answer_and_bumps(check, params, *args):
    versions = [p._version for p in params]
    answer = check(*args)
    return answer, [p._version - v for p, v in zip(params, versions)]


@pytest.mark.parametrize("at", POSITIONS)
@pytest.mark.parametrize("change", [None, *CHANGES])
def test_the_piece_check_answers_as_its_python_twin(threads, change, at):
    native = _native("flat_grads_in_place")
    apply, dtype, master_weights = CHANGES[change] if change else (None, torch.float32, False)
    params, _, flat_set, args = _built(dtype, master_weights)
    if apply:
        apply(params, flat_set.masters, at)
    answers = []
    for check in (native, _flat_grads.python_flat_grads_in_place):
        (stop, flat), bumped = _answer_and_bumps(check, params, *args, 0, MEMBERS, None)
        answers.append((stop, None if flat is None else flat.untyped_storage().data_ptr(), bumped))
    expected_stop = at if change else MEMBERS
    assert answers[0] == answers[1]
    assert answers[0][0] == expected_stop
    assert answers[0][2] == [1] * expected_stop + [0] * (MEMBERS - expected_stop)


def _all_fresh(params, masters, at):
    """After zero_grad(set_to_none=True) and a backward: every grad a new tensor of its own."""
    for p in params:
        p.grad = p.grad.clone()


def _all_views(params, masters, at):
    """Every grad a view of one tensor (the unbound grads of a stacked tensor): they cannot move."""
    whole = torch.cat([p.grad.reshape(-1) for p in params])
    for p, piece in zip(params, whole.split([p.numel() for p in params])):
        p.grad = piece.view(p.shape)


# whole-set changes -> the full check's (status, reason) when fresh grads move, and when they are read in place
WHOLE_SET = {
    "all fresh": (_all_fresh, (_flat_grads.READY, MEMBERS), (_flat_grads.READ_IN_PLACE, MEMBERS)),
    "all views": (_all_views, (_flat_grads.LIST_PATH, _flat_grads.SHARED_GRAD), (_flat_grads.READ_IN_PLACE, MEMBERS)),
}


def _whole_check_answers(change, at, grad_reads):
    """(status, reason, grads, bumps when not refused) of the compiled full check and of its Python twin,
    each on a set built alike and changed alike."""
    native = _native("flat_grads")
    if change in WHOLE_SET:
        apply, dtype, master_weights = WHOLE_SET[change][0], torch.float32, False
    else:
        apply, dtype, master_weights = CHANGES[change] if change else (None, torch.float32, False)
    answers = []
    for check in (native, _flat_grads.python_flat_grads):
        params, _, flat_set, args = _built(dtype, master_weights)
        if apply:
            apply(params, flat_set.masters, at)
        (status, reason, grads), bumped = _answer_and_bumps(check, params, *args, 0, grad_reads)
        if status == _flat_grads.READ_IN_PLACE:
            grads = tuple(grads.tensors()) if check is native else grads
            assert all(g is p.grad for g, p in zip(grads, params))
        answers.append((status, reason, grads, bumped if status in (_flat_grads.READY, _flat_grads.READ_IN_PLACE) else None))
    return answers


@pytest.mark.parametrize("at", POSITIONS)
@pytest.mark.parametrize("change", [None, *CHANGES])
def test_the_whole_check_answers_as_its_python_twin(threads, change, at):
    """Kept grads end in the in-place scan; anything else goes on to the full scan, which must not bump the
    members the in-place one bumped a second time."""
    answers = _whole_check_answers(change, at, _flat_grads.MOVE_FRESH)
    assert answers[0][:2] == answers[1][:2]
    if answers[0][0] == _flat_grads.READY:
        torch.testing.assert_close(answers[0][2], answers[1][2], rtol=0, atol=0)
        assert answers[0][3] == answers[1][3] == [1] * MEMBERS
    expected = {None: (_flat_grads.READY, 0), "fresh grad": (_flat_grads.READY, 1)}
    if change in expected:
        assert answers[0][:2] == expected[change]


@pytest.mark.parametrize("grad_reads", [_flat_grads.MOVE_FRESH, _flat_grads.READ_FRESH], ids=["move", "read"])
@pytest.mark.parametrize("change", list(WHOLE_SET))
def test_the_whole_check_of_a_set_of_fresh_grads_answers_as_its_python_twin(threads, change, grad_reads):
    answers = _whole_check_answers(change, 0, grad_reads)
    expected = WHOLE_SET[change][1 if grad_reads == _flat_grads.MOVE_FRESH else 2]
    assert answers[0][:2] == answers[1][:2] == expected
    if expected[0] == _flat_grads.READY:
        torch.testing.assert_close(answers[0][2], answers[1][2], rtol=0, atol=0)
    if expected[0] in (_flat_grads.READY, _flat_grads.READ_IN_PLACE):
        assert answers[0][3] == answers[1][3] == [1] * MEMBERS


@pytest.mark.parametrize("at", [599, 600, MEMBERS - 1])
@pytest.mark.parametrize("change", ["fresh grad", "missing grad", "moved param"])
def test_steps_of_a_long_set_match_the_per_tensor_path(threads, change, at):
    """On apexlite's kernel (bit for bit against the per-tensor path), with the compiled checks."""
    _native("flat_grads")
    apply = CHANGES[change][0]
    runs = twins(shapes=SHAPES)
    for step in range(4):
        grads = grads_for(runs[0][0], torch.float32, step)
        for params, opt in runs:
            for p, g in zip(params, grads):
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)  # kept: in the grad buffer since step 0
            if step == 2:
                apply(params, None, at)
            opt.step()
    assert_same(*runs)


def _grad_requiring_grad(params, masters, at):
    params[at].grad = params[at].grad.detach().requires_grad_()


# change -> flat_zero_grads' answer on kept grads (NOT_IN_BUFFER: the caller clears them one by one)
ZERO_GRAD_CHANGES = {None: _flat_grads.ZEROED, "fresh grad": _flat_grads.NOT_IN_BUFFER,
                     "missing grad": _flat_grads.NOT_IN_BUFFER, "grad requiring grad": _flat_grads.NOT_IN_BUFFER}


@pytest.mark.parametrize("at", POSITIONS)
@pytest.mark.parametrize("change", list(ZERO_GRAD_CHANGES))
def test_zero_grad_of_kept_grads_answers_as_its_python_twin(threads, change, at):
    """The same answer, grads, grad versions (each advanced once when zeroed, none otherwise) and params'
    versions (never touched) as the Python twin, on sets built and changed alike."""
    native = _native("flat_zero_grads")
    apply = {"fresh grad": _fresh, "missing grad": _missing, "grad requiring grad": _grad_requiring_grad}.get(change)
    seen = []
    for check in (native, _flat_grads.python_flat_zero_grads):
        params, _, flat_set, args = _built(torch.float32, False)
        if apply:
            apply(params, None, at)
        grads = [p.grad for p in params]
        grad_versions = [None if g is None else g._version for g in grads]
        param_versions = [p._version for p in params]
        answer = check(args[0], args[1], flat_set.members, flat_set.offsets, flat_set.grad_like,
                       flat_set.weights.numel(), flat_set.grad_start, False)
        assert all(p.grad is g for p, g in zip(params, grads))
        seen.append((answer,
                     [None if g is None else g._version - v for g, v in zip(grads, grad_versions)],
                     [p._version - v for p, v in zip(params, param_versions)],
                     [None if g is None else bool(g.eq(0).all()) for g in grads]))
    assert seen[0] == seen[1]
    answer, grad_bumps, param_bumps, zeros = seen[0]
    assert answer == ZERO_GRAD_CHANGES[change]
    assert param_bumps == [0] * MEMBERS
    if answer == _flat_grads.ZEROED:
        assert grad_bumps == [1] * MEMBERS and zeros == [True] * MEMBERS
    else:
        assert all(bump in (0, None) for bump in grad_bumps) and not any(zeros)
