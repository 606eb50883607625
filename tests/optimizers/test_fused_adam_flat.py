"""FusedAdam's flat buffers (NOTE [flat buffers], NOTE [flat grads]) as users meet them.

Every case runs FusedAdam next to ``FusedAdam(flat_buffers=False)``, the per-tensor path the other test
modules hold to torch.optim.Adam/AdamW, on the same params and grads: on the compiled kernel the two
must agree bit for bit (the flat op is the list op over one buffer), on torch's fused ops to float32
rounding (torch's CPU kernel orders its vector body and scalar tail differently). And what a user must
not notice: the same Parameter objects, torch's state_dict format, ``.grad`` identity, memory.
Cases that depend on the per-step grad pass run with apexlite._C.flat_grads and with its Python twin.
What changes the buffers (missing grads, casts, replaced state, edited groups): test_fused_adam_flat_changes.py.
"""
from __future__ import annotations

import copy
import io
import pickle
from collections import defaultdict

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from apexlite._native import loader as _ext
from apexlite.optimizers import FusedAdam, _flat_grads
from tests.optimizers.adam_helpers import set_grads
from tests.optimizers.flat_helpers import (  # noqa: F401 (grad_pass: a fixture)
    COMBOS, HYPER, IMPLS, SHAPES, assert_same, count_calls, grad_pass, grads_for, make_params, twins,
)


WIDE_SHAPES = [(16, 8), (64,), (3, 40)]  # averaging 104 elements, against SHAPES' 39.6
# regime -> (shapes, fresh grads every step): fresh grads move into the grad buffer at the first step and are
# read where they are from the second (on apexlite's kernel; the torch path moves them every step; NOTE
# [flat grads]); kept grads stay in the buffer
REGIMES = {"fresh-grads": (SHAPES, True), "fresh-grads-wide": (WIDE_SHAPES, True), "kept-grads": (SHAPES, False)}


@pytest.mark.parametrize("regime", sorted(REGIMES))
@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
@pytest.mark.parametrize("implementation", IMPLS)
def test_flat_buffers_match_the_per_tensor_path(implementation, combo, regime):
    dtype, master_weights, grad_dtype, moment_dtype = combo
    shapes, fresh = REGIMES[regime]
    runs = twins(dtype, implementation, shapes=shapes, master_weights=master_weights, exp_avg_dtype=moment_dtype)
    for step in range(4):
        grads = grads_for(runs[0][0], grad_dtype, step)
        for params, opt in runs:
            if fresh or step == 0:
                set_grads(params, grads)
            else:  # what autograd does to an existing .grad: add in place
                for p, g in zip(params, grads):
                    p.grad.add_(g)
            opt.step()
    assert_same(*runs, exact=implementation == "kernel")


@pytest.mark.parametrize("set_to_none", [True, False])
def test_training_with_autograd_matches_the_per_tensor_path(grad_pass, set_to_none):
    models = []
    for flat in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                    torch.nn.Linear(16, 2))
        models.append((model, FusedAdam(model.parameters(), flat_buffers=flat, **HYPER)))
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen)
        for model, opt in models:
            opt.zero_grad(set_to_none=set_to_none)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    (flat_model, flat_opt), (ref_model, ref_opt) = models
    assert_same((list(flat_model.parameters()), flat_opt), (list(ref_model.parameters()), ref_opt))


def test_params_keep_their_objects_and_share_one_buffer_per_role():
    params = make_params()
    ids = [id(p) for p in params]
    opt = FusedAdam(params, **HYPER)
    set_grads(params, grads_for(params, torch.float32, 0))
    before = [p.detach().clone() for p in params]
    opt.step()
    assert [id(p) for p in opt.param_groups[0]["params"]] == ids
    for role in ("param", "exp_avg", "exp_avg_sq", "step"):
        tensors = params if role == "param" else [opt.state[p][role] for p in params]
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1, role
    assert all(p.is_leaf and p.requires_grad and p._base is None for p in params)
    # one copy of each: the buffers hold exactly the params' and state's elements
    total = sum(p.numel() for p in params)
    assert params[0].untyped_storage().nbytes() == 4 * total
    assert opt.state[params[0]]["step"].untyped_storage().nbytes() == 4 * len(params)
    assert not all(torch.equal(p, b) for p, b in zip(params, before))  # (and the step did update them)



@pytest.mark.parametrize("dtype, master_weights", [(torch.float32, False), (torch.bfloat16, True)])
def test_hooks_on_params_keep_firing_after_the_buffers_are_built(dtype, master_weights):
    """DDP's reducer hooks each param's grad accumulator: moving a param into its buffer must keep
    that node (Tensor.set_ would make a new one and DDP would silently stop reducing). As torch's Adam."""
    fired = defaultdict(int)
    runs, accumulators = [], []  # held, as DDP holds them: autograd keeps a param's node weakly
    for name, make in (("fused", lambda ps: FusedAdam(ps, master_weights=master_weights, **HYPER)),
                       ("torch", lambda ps: torch.optim.Adam(ps, lr=1e-2))):
        params = make_params(dtype)
        for index, p in enumerate(params):
            accumulators.append(p.view_as(p).grad_fn.next_functions[0][0])
            accumulators[-1].register_hook(lambda *_, key=(name, "node", index): fired.__setitem__(key, fired[key] + 1))
            p.register_post_accumulate_grad_hook(lambda _, key=(name, "post", index): fired.__setitem__(
                key, fired[key] + 1))
        runs.append((name, params, make(params)))
    for _ in range(3):
        for name, params, opt in runs:
            opt.zero_grad()
            sum(p.float().sum() for p in params).backward()
            opt.step()
    assert len(runs[0][1][0].untyped_storage()) > runs[0][1][0].nbytes  # (the params did move into a buffer)
    assert {key: count for key, count in fired.items() if key[0] == "fused"} == {
        ("fused",) + key[1:]: count for key, count in fired.items() if key[0] == "torch"}
    assert set(fired.values()) == {3}


def test_state_dict_has_torchs_format_and_loads_weights_only():
    params = make_params()
    opt, ref = FusedAdam(params, **HYPER), torch.optim.AdamW(make_params(), **HYPER)
    for optimizer in (opt, ref):
        group_params = optimizer.param_groups[0]["params"]
        set_grads(group_params, grads_for(group_params, torch.float32, 0))
        optimizer.step()
    ours, theirs = opt.state_dict(), ref.state_dict()
    assert ours["state"].keys() == theirs["state"].keys()
    for index, entry in ours["state"].items():
        assert type(entry) is dict and entry.keys() == theirs["state"][index].keys()
        for key, value in entry.items():
            want = theirs["state"][index][key]
            assert (value.shape, value.dtype) == (want.shape, want.dtype), key
    buffer = io.BytesIO()
    torch.save(ours, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["state"].keys() == ours["state"].keys()
    assert type(pickle.loads(pickle.dumps(opt.state))) is defaultdict
    assert type(copy.deepcopy(opt.state[params[0]])) is dict and type(copy.copy(opt.state)) is defaultdict


@pytest.mark.parametrize("count", [1, 300])
def test_one_call_per_buffer_set_whatever_the_tensor_count(monkeypatch, count):
    if not _ext.kernels_available("cpu"):
        pytest.skip("compiled CPU kernel not built")
    params = make_params(shapes=[(3,)] * count) + make_params(torch.bfloat16, shapes=[(2,)] * count)
    opt = FusedAdam(params, master_weights=True, **HYPER)
    calls = count_calls(monkeypatch)
    for step in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
    # a float32 set and a bf16-with-masters set, each step: the first step's fresh grads move into the grad
    # buffers, the later ones are read where they are
    assert calls == {"flat": 2, "read": 2 * 2, "lists": 0}


@pytest.mark.parametrize("step_count, counted", [("group", 4.0), ("param", 3.0)])
def test_a_first_step_without_grads_costs_no_rebuild(step_count, counted, monkeypatch):
    params = make_params()
    opt = FusedAdam(params, **HYPER, step_count=step_count)
    opt.step()  # nothing to do yet (e.g. a scheduler test call before the first backward)
    calls = count_calls(monkeypatch)
    for step in range(3):
        set_grads(params, grads_for(params, torch.float32, step))
        opt.step()
    # fresh grads each step: moved once, then read in place by apexlite's kernel; moved each step on torch's ops
    assert calls == ({"flat": 1, "read": 2, "lists": 0} if _ext.kernels_available("cpu") else
                     {"flat": 3, "read": 0, "lists": 0})
    assert all(float(opt.state[p]["step"]) == counted for p in params)  # apex counted the empty step


# fresh grads of this many floats each, every step or only at the first -> per path, (calls with the grad
# buffer, calls reading the grads where they are) of 4 steps; the rest per tensor. apexlite's kernels read
# fresh grads where they are; torch's fused ops (the "torch" path) need them in the buffer or per tensor.
AGAIN, ONCE = _flat_grads.MAX_FRESH_AVERAGE_CPU_AGAIN, _flat_grads.MAX_FRESH_AVERAGE_CPU
LARGE_FRESH_CPU = {
    # moved at the first step; fresh again right after (a set_to_none loop): read where they are from then on,
    # or on the torch path moved again while a copy costs less than the per-tensor path
    "set-to-none-loop-small": (AGAIN, True, {"kernel": (1, 3), "torch": (4, 0)}),
    "set-to-none-loop-larger": (AGAIN + 1, True, {"kernel": (1, 3), "torch": (1, 0)}),
    "set-to-none-loop-largest-moved": (ONCE, True, {"kernel": (1, 3), "torch": (1, 0)}),
    # too large to copy (a new buffer's page faults) even once: read where they are from the first step
    "set-to-none-loop-never-moved": (ONCE + 1, True, {"kernel": (0, 4), "torch": (0, 0)}),
    # moved at the first step, then kept in the buffer (set_to_none=False, accumulation): flat throughout
    "moved-once-then-kept": (ONCE, False, {"kernel": (4, 0), "torch": (4, 0)}),
}


@pytest.mark.parametrize("implementation", IMPLS)
@pytest.mark.parametrize("case", sorted(LARGE_FRESH_CPU))
def test_large_fresh_cpu_grads_are_read_in_place(grad_pass, monkeypatch, case, implementation):
    size, fresh_every_step, expected = LARGE_FRESH_CPU[case]
    flat_calls, read_calls = expected[implementation]
    runs = twins(implementation=implementation, shapes=[(size,), (size,)])
    calls = count_calls(monkeypatch)
    for step in range(4):
        grads = grads_for(runs[0][0], torch.float32, step)
        for params, opt in runs:
            if fresh_every_step or step == 0:
                set_grads(params, grads)
            else:
                for p, g in zip(params, grads):
                    p.grad.copy_(g)
            opt.step()
    assert_same(*runs, exact=implementation == "kernel")
    # (the twin's 4 steps are per tensor)
    assert calls == {"flat": flat_calls, "read": read_calls, "lists": 4 + 4 - flat_calls - read_calls}


def test_grads_keep_their_identity_and_live_in_the_buffer(grad_pass):
    params = make_params()
    opt = FusedAdam(params, **HYPER)
    grads = grads_for(params, torch.float32, 0)
    set_grads(params, grads)
    assigned = [p.grad for p in params]
    opt.step()
    assert all(p.grad is g for p, g in zip(params, assigned))
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))
    assert len({p.grad.untyped_storage().data_ptr() for p in params}) == 1
    where = [p.grad.data_ptr() for p in params]
    for p in params:  # what a backward does to an existing .grad
        p.grad.mul_(2)
    opt.step()
    assert [p.grad.data_ptr() for p in params] == where  # nothing moved, nothing copied


@pytest.mark.parametrize("then", ["fresh", "kept", "zeroed-and-accumulated"])
def test_fresh_grads_after_fresh_grads_are_read_where_they_are(grad_pass, monkeypatch, then):
    """A set_to_none loop: the first step moves the fresh grads into a grad buffer; from the next one
    apexlite's kernel reads each where autograd left it (no copy, no new buffer, .grad untouched), and
    the grads it read stay where they are when they are then kept; as the per-tensor path throughout."""
    runs = twins(shapes=WIDE_SHAPES)
    calls = count_calls(monkeypatch)
    for step in range(5):
        grads = grads_for(runs[0][0], torch.float32, step)
        for flat, (params, opt) in zip((True, False), runs):
            if step < 3 or then == "fresh":
                set_grads(params, grads)
            elif then == "kept":
                for p, g in zip(params, grads):
                    p.grad.add_(g)
            else:
                opt.zero_grad(set_to_none=False)
                for p, g in zip(params, grads):
                    p.grad.add_(g)
            assigned = [(p.grad, p.grad.data_ptr()) for p in params]
            opt.step()
            assert all(p.grad is grad for p, (grad, _) in zip(params, assigned))
            moved = [p.grad.data_ptr() for p in params] != [ptr for _, ptr in assigned]
            assert moved == (flat and step == 0)  # into the grad buffer at the first step only
    assert_same(*runs)
    # the grads, once read where they are, stay where they are when kept: each later step reads them there
    assert calls == {"flat": 1, "read": 4, "lists": 5}


@pytest.mark.parametrize("shapes", [[(1,), (2,)], [(4, 15), (63,)], [(4, 16), (64,)]],
                         ids=["1.5-elements", "63.5-elements", "64-elements"])
def test_fresh_grads_of_any_size_are_read_where_they_are_from_the_second_step(grad_pass, monkeypatch, shapes):
    runs = twins(shapes=shapes)
    calls = count_calls(monkeypatch)
    for step in range(3):
        grads = grads_for(runs[0][0], torch.float32, step)
        for params, opt in runs:
            set_grads(params, grads)
            opt.step()
    assert_same(*runs)
    assert calls == {"flat": 1, "read": 2, "lists": 3}  # (lists: flat_buffers=False's)


def test_grad_scaler_unscales_into_the_same_grad_tensors(grad_pass):
    params = make_params()
    opt = FusedAdam(params, **HYPER)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    grads = grads_for(params, torch.float32, 0)
    for step in range(2):
        scaler.scale(torch.ones(()))  # (what scaling a loss does to the scaler)
        for p, g in zip(params, grads):
            p.grad = g * 1024.0
        assigned = [p.grad for p in params]
        scaler.step(opt)
        scaler.update()
        assert all(p.grad is a for p, a in zip(params, assigned))
        assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))


def test_setting_grads_to_none_frees_the_grad_buffer(grad_pass):
    params = make_params()
    opt = FusedAdam(params, **HYPER)
    set_grads(params, grads_for(params, torch.float32, 0))
    opt.step()
    buffer = StorageWeakRef(params[0].grad.untyped_storage())
    opt.zero_grad(set_to_none=True)
    assert buffer.expired()


@pytest.mark.parametrize("replaced", ["one-grad", "all-grads"])
def test_a_grad_kept_from_an_earlier_step_keeps_its_values(grad_pass, replaced):
    params = make_params()
    opt = FusedAdam(params, **HYPER)
    set_grads(params, grads_for(params, torch.float32, 0))
    opt.step()
    kept = params[1].grad
    kept_values = kept.clone()
    fresh = grads_for(params, torch.float32, 1)
    if replaced == "one-grad":  # the others stay in the grad buffer, next to the kept one's old place
        params[1].grad = fresh[1]
    else:
        opt.zero_grad(set_to_none=True)
        set_grads(params, fresh)
    opt.step()
    assert torch.equal(kept, kept_values)
    assert torch.equal(params[1].grad, fresh[1])


def _laid_out(seed=4):
    """A channels_last conv weight, a transposed matrix and a plain one (288, 144 and 100 elements)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(8, 4, 3, 3, generator=gen).to(memory_format=torch.channels_last)),
            torch.nn.Parameter(torch.randn(16, 9, generator=gen).t()),
            torch.nn.Parameter(torch.randn(10, 10, generator=gen))]


# grads' layout in a set_to_none loop -> (calls with the grad buffer, calls reading grads in place) of 4 steps
GRAD_LAYOUTS = {
    "like-the-params": (1, 3),  # moved at the first step, then read where they are, in their layouts
    "contiguous": (0, 0),  # a channels_last / transposed param's contiguous grad: the set goes per tensor
    # moved, read in place, then a stride-0 grad (no dense block) sends the set per tensor at steps 2 and 3
    "expanded-from-step-2": (1, 1),
}


@pytest.mark.parametrize("layout", sorted(GRAD_LAYOUTS))
def test_fresh_grads_in_their_params_layouts_are_read_in_place(grad_pass, monkeypatch, layout):
    runs = []
    for flat in (True, False):
        params = _laid_out()
        runs.append((params, FusedAdam(params, implementation="kernel", flat_buffers=flat, **HYPER)))
    if not _ext.kernels_available("cpu"):
        pytest.skip("compiled CPU kernel not built")
    calls = count_calls(monkeypatch)
    for step in range(4):
        gen = torch.Generator().manual_seed(10 + step)
        values = [torch.randn(p.shape, generator=gen) for p in runs[0][0]]
        for params, opt in runs:
            for index, (p, v) in enumerate(zip(params, values)):
                if layout == "contiguous":
                    p.grad = v.clone()
                elif layout == "expanded-from-step-2" and step >= 2 and index == 2:
                    p.grad = v[:1].expand_as(p)
                else:
                    p.grad = torch.empty_like(p).copy_(v)  # (empty_like keeps the param's strides)
            opt.step()
    assert_same(*runs)
    assert runs[0][0][0].is_contiguous(memory_format=torch.channels_last) and not runs[0][0][1].is_contiguous()
    flat_calls, read_calls = GRAD_LAYOUTS[layout]
    assert calls == {"flat": flat_calls, "read": read_calls, "lists": 4 + 4 - flat_calls - read_calls}


def test_an_overflowing_step_on_grads_read_in_place_leaves_everything_bit_identical(grad_pass, monkeypatch):
    params = make_params(shapes=WIDE_SHAPES)
    opt = FusedAdam(params, implementation="kernel" if _ext.kernels_available("cpu") else "auto", **HYPER)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    calls = count_calls(monkeypatch)
    for step in range(3):
        grads = grads_for(params, torch.float32, step)
        if step == 2:
            grads[1][5] = float("inf")
        scaler.scale(torch.ones(()))
        for p, g in zip(params, grads):
            p.grad = g * 256.0
        before = [p.detach().clone() for p in params], {k: v.clone() for k, v in opt.state[params[0]].items()}
        scaler.step(opt)
        scaler.update()
    assert all(torch.equal(p, b) for p, b in zip(params, before[0]))
    assert all(torch.equal(opt.state[params[0]][k], v) for k, v in before[1].items())
    assert scaler.get_scale() == 128.0
    if _ext.kernels_available("cpu"):
        assert calls == {"flat": 1, "read": 2, "lists": 0}  # the overflowing step's call is told found_inf
