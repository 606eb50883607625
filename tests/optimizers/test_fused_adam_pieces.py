"""FusedAdam stepping a large flat set in pieces (NOTE [flat grads]; on a GPU by default, forced on the CPU
here): each piece is checked, then launched, so a GPU starts while the host checks the rest. Whatever a
user changes part-way through the set, the results must be the per-tensor path's, bit for bit on the
kernel: kept grads, fresh grads, one fresh or missing grad or one replaced param after the first piece,
GradScaler's scale and found_inf, an edited params list. Each case also counts the calls it makes, so a
step that quietly fell back to one call (or to the per-tensor path) fails. Native and Python checks.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from apexlite.optimizers import FusedAdam, _flat_grads
from apexlite.optimizers._adam_step import resolve
from apexlite.optimizers._flat_runs import PiecePolicy
from tests.optimizers.adam_helpers import set_grads
from tests.optimizers.flat_helpers import (  # noqa: F401 (grad_pass: a fixture)
    HYPER, IMPLS, assert_same, count_calls, grad_pass, grads_for, twins,
)

# 12 params of odd sizes: most pieces start off a vector boundary
SHAPES = [(3, 5), (7,), (2, 3, 3), (1,), (5, 5), (9,), (4, 3), (11,), (2, 2), (13,), (3, 3), (6,)]
# pieces: members [0,2) [2,6) [6,10) [10,12)
POLICY = PiecePolicy(devices=("cpu",), min_members=2, min_elements=1, first=2, min_piece=3, max_pieces=4)
PIECES = 4
LATE = 7  # a member of the third piece


def _keep(params, grads):
    """What a backward into kept grads does: the values land in the tensors .grad already holds."""
    for p, g in zip(params, grads):
        p.grad.copy_(g)


def _fresh_one(params, grads):
    _keep(params, grads)
    params[LATE].grad = grads[LATE].clone()


def _missing_one(params, grads):
    _keep(params, grads)
    params[LATE].grad = None


def _moved_one(params, grads):
    _keep(params, grads)
    params[LATE].data = params[LATE].data.clone()  # what a cast or a load that replaces .data does


def _fresh_first(params, grads):
    _keep(params, grads)
    params[0].grad = grads[0].clone()


# change at step 2 -> (how step 2 sets the grads, flat calls of step 2, per-tensor calls of step 2,
#                      flat calls of step 3)
CHANGES = {
    "kept": (_keep, PIECES, 0, PIECES),
    "fresh-all": (set_grads, 1, 0, PIECES),  # the first member is not in place: the full check, one call
    "fresh-first": (_fresh_first, 1, 0, PIECES),
    # pieces [0,2) [2,6) [6,7), then the full check moves the fresh grad in: one call for [7,12)
    "fresh-after-the-first-piece": (_fresh_one, 4, 0, PIECES),
    # pieces [0,2) [2,6) [6,7), the rest per tensor (the missing grad's param not stepped); the layout is
    # rebuilt at step 3, grads fresh to it: in one set (apex's group count) or in two (torch's: the member
    # that missed a step has its own count)
    "missing-after-the-first-piece": (_missing_one, 3, 1, {"group": 1, "param": 2}),
    # rebuilt at step 3 in one set, of the same layout: the kept grads lie in place for it too
    "moved-after-the-first-piece": (_moved_one, 3, 1, PIECES),
}


def _pieces_twins(implementation, **kw):
    runs = twins(implementation=implementation, shapes=SHAPES, **kw)
    runs[0][1]._flat.piece_policy = POLICY
    return runs


def _first_steps(runs):
    """Steps 0 and 1 with fresh grads, then kept ones: the buffers are built and every grad is in place."""
    for step in range(2):
        grads = grads_for(runs[0][0], torch.float32, step)
        for params, opt in runs:
            (set_grads if step == 0 else _keep)(params, grads)
            opt.step()


@pytest.mark.parametrize("implementation", IMPLS)
@pytest.mark.parametrize("step_count", ["group", "param"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_part_way_through_the_set_steps_like_the_per_tensor_path(grad_pass, implementation, change,
                                                                            step_count, monkeypatch):
    how, flat_calls, list_calls, next_flat_calls = CHANGES[change]
    if isinstance(next_flat_calls, dict):
        next_flat_calls = next_flat_calls[step_count]
    runs = _pieces_twins(implementation, step_count=step_count)
    _first_steps(runs)
    calls = count_calls(monkeypatch)
    seen = []
    for step in (2, 3):
        grads = grads_for(runs[0][0], torch.float32, step)
        setting = how if step == 2 else set_grads if runs[0][0][LATE].grad is None else _keep
        for index, (params, opt) in enumerate(runs):
            setting(params, grads)
            before = dict(calls)
            opt.step()
            if index == 0:
                seen.append((calls["flat"] - before["flat"], calls["lists"] - before["lists"]))
    assert_same(*runs, exact=implementation == "kernel")
    assert seen[0] == (flat_calls, list_calls)
    assert seen[1][0] == next_flat_calls
    steps = [float(runs[0][1].state[p]["step"]) for p in runs[0][0]]
    ref_steps = [float(runs[1][1].state[p]["step"]) for p in runs[1][0]]
    assert steps == ref_steps


@pytest.mark.parametrize("found_inf", [0.0, 1.0], ids=["finite", "overflow"])
def test_grad_scaler_flags_reach_every_piece(grad_pass, found_inf, monkeypatch):
    runs = _pieces_twins("kernel")
    _first_steps(runs)
    before = [[p.detach().clone() for p in params] for params, _ in runs]
    calls = count_calls(monkeypatch)
    grads = grads_for(runs[0][0], torch.float32, 5)
    for params, opt in runs:
        _keep(params, [g * 1024.0 for g in grads])
        opt.grad_scale, opt.found_inf = torch.tensor([1024.0]), torch.tensor([found_inf])
        opt.step()
        del opt.grad_scale, opt.found_inf
    assert calls["flat"] == PIECES
    assert_same(*runs)
    if found_inf:
        for params, saved in zip((runs[0][0],), before[:1]):
            for p, old in zip(params, saved):
                assert torch.equal(p.detach(), old), "a skipped step must leave the params bit-identical"
    for p, r in zip(runs[0][0], runs[1][0]):  # unscaled grads stored into .grad, as the per-tensor path does
        torch.testing.assert_close(p.grad, r.grad, rtol=0, atol=0)


def test_an_edited_params_list_is_found_at_the_first_piece(grad_pass, monkeypatch):
    runs = _pieces_twins("kernel")
    _first_steps(runs)
    calls = count_calls(monkeypatch)
    grads = grads_for(runs[0][0], torch.float32, 7)
    for params, opt in runs:
        _keep(params, grads)
        opt.param_groups[0]["params"].pop(LATE)
        opt.step()
    assert calls["flat"] == 0  # the whole group per tensor this step
    assert_same(*runs)


def test_the_piece_check_and_its_python_twin_agree(monkeypatch):
    """apexlite._C.flat_grads_in_place against _flat_grads.python_flat_grads_in_place: stops, buffers, bumps."""
    if _flat_grads._native("flat_grads_in_place") is None:
        pytest.skip("apexlite's compiled library is not loaded")
    answers = []
    for run in ("native", "python"):
        runs = _pieces_twins("kernel")
        _first_steps(runs)
        params, opt = runs[0]
        flat_set = opt._flat._layouts[id(opt.param_groups[0])][1].sets[0]
        params[LATE].grad = params[LATE].grad.clone()
        check = _flat_grads.flat_grads_in_place if run == "native" else _flat_grads.python_flat_grads_in_place
        args = (opt.param_groups[0]["params"], tuple(params), flat_set.members, flat_set.masters, flat_set.param_spans,
                flat_set.offsets, flat_set.grad_like, flat_set.weights.numel(), flat_set.grad_start)
        versions = [p._version for p in params]
        stop, flat = check(*args, 0, 4, None)
        again, same = check(*args, 4, len(params), flat)
        assert same is flat
        assert flat.untyped_storage().data_ptr() == params[0].grad.untyped_storage().data_ptr()
        bumped = [p._version - v for p, v in zip(params, versions)]
        answers.append((stop, again, bumped))
    assert answers == [(4, LATE, [1] * LATE + [0] * (len(SHAPES) - LATE))] * 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("master_weights", [False, True], ids=["fp32", "bf16-masters"])
def test_pieces_on_a_gpu_match_the_per_tensor_path(master_weights, monkeypatch):
    """The compiled CUDA kernel on pieces that start off its vector boundaries (odd param sizes)."""
    shapes = [(3 + index % 7, 5) if index % 3 else (1 + index % 5,) for index in range(300)]
    dtype = torch.bfloat16 if master_weights else torch.float32
    runs = []
    for flat in (True, False):
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype).cuda()) for shape in shapes]
        runs.append((params, FusedAdam(params, flat_buffers=flat, master_weights=master_weights, **HYPER)))
    runs[0][1]._flat.piece_policy = PiecePolicy(min_members=2, min_elements=1, first=40, min_piece=37)
    calls = count_calls(monkeypatch)
    for step in range(4):
        gen = torch.Generator().manual_seed(step)
        grads = [torch.randn(shape, generator=gen).to(dtype).cuda() for shape in shapes]
        for params, opt in runs:
            for p, g in zip(params, grads):
                if step < 2:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)  # kept: in the grad buffer since step 1
            opt.step()
    assert calls["flat"] == 1 + 1 + 2 * 8  # steps 0-1 checked whole, 2-3 in 8 pieces: 40, then runs of 38 (last 32)
    assert_same(*runs)


def _set(members: int, elements: int, device: str):
    """What PiecePolicy.bounds reads of a set: its members, and its weights buffer's device and size."""
    weights = SimpleNamespace(device=torch.device(device), numel=lambda: elements)
    return SimpleNamespace(members=(None,) * members, weights=weights)


# (members, elements, device) -> the default policy's piece ends (None: one call)
DEFAULT_CUTS = {
    (1, 100_000_000, "cuda"): None,
    (100, 100_000_000, "cuda"): None,  # a short check: nothing to hide
    (2_000, 32_000, "cuda"): None,  # 2,000 tiny tensors: no device work to hide it behind
    (1_000, 100_000_000, "cuda"): [64, 376, 688, 1_000],  # runs of at least 256: three of 312 after the first
    (10_000, 100_000_000, "cuda"): [64, 1_484, 2_904, 4_324, 5_744, 7_164, 8_584, 10_000],  # 8 at most: 7 of 1,420
    (10_000, 100_000_000, "cpu"): None,  # the CPU kernel finishes before step() goes on
}


@pytest.mark.parametrize("members, elements, device", sorted(DEFAULT_CUTS))
def test_the_default_policy_cuts_long_checks_of_large_sets_on_a_gpu_only(members, elements, device):
    assert PiecePolicy().bounds(_set(members, elements, device)) == DEFAULT_CUTS[(members, elements, device)]


@pytest.mark.parametrize("begin, end", [(5, 4), (0, len(SHAPES) + 1), (-1, 3)])
def test_a_piece_outside_the_members_is_refused_by_both_checks(begin, end):
    runs = _pieces_twins("kernel")
    _first_steps(runs)
    params, opt = runs[0]
    flat_set = opt._flat._layouts[id(opt.param_groups[0])][1].sets[0]
    args = (opt.param_groups[0]["params"], tuple(params), flat_set.members, flat_set.masters, flat_set.param_spans,
            flat_set.offsets, flat_set.grad_like, flat_set.weights.numel(), flat_set.grad_start, begin, end, None)
    checks = [_flat_grads.python_flat_grads_in_place]
    if _flat_grads._native("flat_grads_in_place") is not None:
        checks.append(_flat_grads._native("flat_grads_in_place"))
    for check in checks:
        with pytest.raises((ValueError, RuntimeError), match=rf"members \[{begin}, {end}\) is no range of the 12"):
            check(*args)


def test_a_refused_grad_after_the_first_piece_raises_after_the_pieces_before_it_stepped(grad_pass):
    """The one difference from a set checked whole (docs/fused_adam.md): the error still comes, naming the
    dtypes, but the pieces before the refused grad have stepped (a whole check refuses before any update)."""
    if not hasattr(torch.Tensor, "grad_dtype"):
        pytest.skip("this torch cannot attach a gradient of another dtype (no Tensor.grad_dtype)")
    runs = _pieces_twins("kernel")
    _first_steps(runs)
    params, opt = runs[0]
    before = [p.detach().clone() for p in params]
    _keep(params, grads_for(params, torch.float32, 9))
    params[LATE].grad = None
    params[LATE].grad_dtype = torch.float64
    params[LATE].grad = torch.ones(params[LATE].shape, dtype=torch.float64)
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        opt.step()
    moved = [not torch.equal(p.detach(), old) for p, old in zip(params, before)]
    assert moved == [True] * 7 + [False] * (len(SHAPES) - 7)  # pieces [0,2) [2,6) and [6,7) stepped


def _laid_out_params():
    """12 params in pieces [0,2) [2,6) [6,10) [10,12): channels_last conv weights, transposed matrices, plain."""
    gen = torch.Generator().manual_seed(3)
    params = []
    for index in range(12):
        if index % 3 == 0:
            tensor = torch.randn(4, 3, 3, 3, generator=gen).to(memory_format=torch.channels_last)
        elif index % 3 == 1:
            tensor = torch.randn(5, 4 + index, generator=gen).t()
        else:
            tensor = torch.randn(3, 7, generator=gen)
        params.append(torch.nn.Parameter(tensor))
    return params


def _expand_one(params, grads):
    """An expanded grad (stride 0, read-only memory) after the first piece: not laid out like its param."""
    _keep(params, grads)
    params[8].grad = grads[8][:1].expand_as(params[8]).clone().as_strided(params[8].shape, (0, 1))


@pytest.mark.parametrize("change", ["kept", "expanded"])
def test_pieces_over_channels_last_transposed_and_expanded_layouts(grad_pass, change, monkeypatch):
    runs = []
    for flat in (True, False):
        params = _laid_out_params()
        runs.append((params, FusedAdam(params, flat_buffers=flat, **HYPER)))
    runs[0][1]._flat.piece_policy = POLICY
    assert runs[0][0][0].is_contiguous(memory_format=torch.channels_last) and not runs[0][0][1].is_contiguous()
    calls = count_calls(monkeypatch)
    for step in range(4):
        grads = [torch.randn_like(p, memory_format=torch.preserve_format) for p in runs[0][0]]
        for params, opt in runs:
            if step == 0:
                for p, g in zip(params, grads):
                    p.grad = g.clone(memory_format=torch.preserve_format)
            elif step == 3 and change == "expanded":
                _expand_one(params, grads)
            else:
                _keep(params, grads)
            opt.step()
    assert_same(*runs, exact=resolve("auto", torch.device("cpu")) == "kernel")  # torch's fused ops: to rounding
    assert runs[0][0][0].is_contiguous(memory_format=torch.channels_last)  # layouts kept in the buffers
    # step 0 checked whole; steps 1-2 in 4 pieces; step 3: 4 pieces, or [0,2) [2,6) [6,8) then the rest per tensor
    assert calls["flat"] == 1 + 2 * PIECES + (PIECES if change == "kept" else 3)
