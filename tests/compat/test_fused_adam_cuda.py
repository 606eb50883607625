"""`fused_adam_cuda` (apexlite.compat.fused_adam_cuda): apex's 2019 Adam kernels against the kernel's formula
in fp64 (tests/_helpers/optimizer_refs.adam_2019) and torch.optim.Adam, with apex's argument order; the
kernels of apex's old DistributedFusedAdam raise with the alternative."""
import itertools

import pytest
import torch

from apexlite.compat import fused_adam_cuda
from apexlite.compat._unsupported import ApexliteUnsupportedError
from apexlite.compat.apex_tree import tree
from tests._helpers import optimizer_refs as ref

LR, BETAS, EPS = 1e-2, (0.9, 0.99), 1e-6
SHAPES = [(4, 3), (7,), (2, 2, 2)]


def _state(shape, seed):
    generator = torch.Generator().manual_seed(seed)
    p = torch.randn(shape, generator=generator)
    return p, torch.zeros_like(p), torch.zeros_like(p)


def _grads(shape, steps, seed, scale):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) * scale for _ in range(steps)]


CASES = list(itertools.product([0, 1], [0, 1], [0.0, 0.05], [1.0, 128.0]))


@pytest.mark.parametrize("mode,bias_correction,decay,scale", CASES, ids=[
    f"mode{m}-bc{b}-wd{d}-scale{s:g}" for m, b, d, s in CASES])
def test_adam_follows_the_kernel_formula(mode, bias_correction, decay, scale):
    p, m, v = _state((4, 3), 1)
    want = (p.double(), m.double(), v.double())
    for step, g in enumerate(_grads((4, 3), 3, 2, scale), start=1):
        fused_adam_cuda.adam(p, torch.empty(0), m, v, g, LR, *BETAS, EPS, scale, step, mode, bias_correction, decay)
        want = ref.adam_2019(*want[:1], g.double(), *want[1:], lr=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS,
                             step=step, bias_correction=bool(bias_correction), wd=decay, scale=scale,
                             eps_inside_sqrt=mode == 0)
    for got, expected in zip((p, m, v), want):
        torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-6)


def test_adam_without_decay_is_torchs_adam_up_to_eps_placement():
    p, m, v = _state((5, 4), 3)
    reference = p.clone().requires_grad_()
    optimizer = torch.optim.Adam([reference], lr=LR, betas=BETAS, eps=1e-8)
    for step, g in enumerate(_grads((5, 4), 4, 4, 1.0), start=1):
        fused_adam_cuda.adam(p, torch.empty(0), m, v, g, LR, *BETAS, 1e-8, 1.0, step, 1, 1, 0.0)
        reference.grad = g.clone()
        optimizer.step()
    torch.testing.assert_close(p, reference.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("grad_dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_grads_update_fp32_masters_and_write_the_half_copy(grad_dtype):
    p, m, v = _state((6,), 5)
    copy = torch.zeros(6, dtype=grad_dtype)
    g = torch.randn(6).to(grad_dtype)
    fused_adam_cuda.adam(p, copy, m, v, g, LR, *BETAS, EPS, 2.0, 1, 1, 1, 0.0)
    want, _, _ = ref.adam_2019(_state((6,), 5)[0].double(), g.double(), torch.zeros(6, dtype=torch.float64),
                               torch.zeros(6, dtype=torch.float64), lr=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS,
                               step=1, bias_correction=True, wd=0.0, scale=2.0)
    torch.testing.assert_close(p, want.float(), rtol=1e-5, atol=1e-6)
    assert torch.equal(copy, p.to(grad_dtype))


def test_fp32_grads_leave_p_copy_unwritten_as_apexs_kernel_did():
    p, m, v = _state((6,), 6)
    copy = torch.full((6,), 7.0)
    fused_adam_cuda.adam(p, copy, m, v, torch.randn(6), LR, *BETAS, EPS, 1.0, 1, 1, 1, 0.0)
    assert torch.equal(copy, torch.full((6,), 7.0))


@pytest.mark.parametrize("copies", [False, True], ids=["four_lists", "five_lists"])
def test_adam_mt_is_adam_on_every_tensor(copies):
    states = [_state(shape, 10 + index) for index, shape in enumerate(SHAPES)]
    singles = [tuple(t.clone() for t in state) for state in states]
    grads = [torch.randn(shape) for shape in SHAPES]
    lists = [[s[0] for s in states], [s[1] for s in states], [s[2] for s in states], grads]
    outputs = [torch.zeros(shape) for shape in SHAPES]
    fused_adam_cuda.adam_mt(2048, torch.zeros(1, dtype=torch.int), lists + ([outputs] if copies else []), LR, *BETAS,
                            EPS, 4.0, 2, 0, 1, 0.01)
    for (p, m, v), (sp, sm, sv), g, out in zip(states, singles, grads, outputs):
        fused_adam_cuda.adam(sp, torch.empty(0), sm, sv, g, LR, *BETAS, EPS, 4.0, 2, 0, 1, 0.01)
        for got, want in ((p, sp), (m, sm), (v, sv)):
            torch.testing.assert_close(got, want)
        assert torch.equal(out, p) if copies else not out.any()


@pytest.mark.parametrize("call,message", [
    (lambda: fused_adam_cuda.adam(torch.zeros(3, dtype=torch.half), torch.empty(0), torch.zeros(3, dtype=torch.half),
                                  torch.zeros(3, dtype=torch.half), torch.ones(3, dtype=torch.half), LR, *BETAS, EPS,
                                  1.0, 1, 1, 1, 0.0), "must be float32"),
    (lambda: fused_adam_cuda.adam(torch.zeros(3), torch.empty(0), torch.zeros(3), torch.zeros(3), torch.ones(4), LR,
                                  *BETAS, EPS, 1.0, 1, 1, 1, 0.0), "number of elements in g"),
    (lambda: fused_adam_cuda.adam(torch.zeros(3), torch.empty(0), torch.zeros(3), torch.zeros(3), torch.ones(3), LR,
                                  *BETAS, EPS, 1.0, 1, 2, 1, 0.0), "mode must be 0"),
])
def test_bad_arguments_raise_clearly(call, message):
    with pytest.raises((RuntimeError, ValueError), match=message):
        call()


UNSUPPORTED = [row.name.rpartition(".")[2] for row in tree().members("fused_adam_cuda")
               if tree().status(row.name)[0] == "unsupported"]


def test_the_unsupported_kernels_are_the_old_distributed_optimizers():
    assert sorted(UNSUPPORTED) == ["maybe_adam_undo", "maybe_cast", "maybe_cast_mt", "reversible_adam",
                                   "strided_check_finite"]


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_the_old_distributed_optimizer_kernels_raise_with_the_alternative(name):
    with pytest.raises(ApexliteUnsupportedError, match="ZeroRedundancyOptimizer"):
        getattr(fused_adam_cuda, name)(torch.zeros(1))
