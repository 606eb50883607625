"""`fused_lamb_cuda` (apexlite.compat.fused_lamb_cuda): apex's 2019 LAMB kernel against the LAMB formula of
tests/_helpers/optimizer_refs (the trust ratio only where weight decay applies), with apex's argument order
and the gradient norm as a number; the update direction is left in the gradients, as apex's kernel did."""
import pytest
import torch

from apexlite.compat import fused_lamb_cuda
from tests._helpers import optimizer_refs as ref

SHAPES = [(4, 3), (7,), (2, 5)]
CASES = [
    dict(mode=1, wd=0.01, grad_averaging=1, bias_correction=1, max_norm=1.0),
    dict(mode=0, wd=0.01, grad_averaging=0, bias_correction=1, max_norm=1.0),
    dict(mode=1, wd=0.0, grad_averaging=1, bias_correction=0, max_norm=100.0),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_lamb_follows_the_formula_and_leaves_updates_in_grads(case):
    generator = torch.Generator().manual_seed(3)
    params = [torch.randn(shape, generator=generator) for shape in SHAPES]
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    want_p, want_m, want_v = [p.clone() for p in params], [m.clone() for m in ms], [v.clone() for v in vs]
    for step in (1, 2):
        grads = [torch.randn(shape, generator=generator) for shape in SHAPES]
        norm = float(torch.stack([g.norm() for g in grads]).norm())
        want_p, want_m, want_v, updates = ref.lamb(
            want_p, grads, want_m, want_v, lr=0.02, beta1=0.9, beta2=0.999, eps=1e-6, step=step,
            bias_correction=bool(case["bias_correction"]), wd=[case["wd"]] * len(params),
            grad_averaging=bool(case["grad_averaging"]), mode=case["mode"], global_norm=norm,
            max_norm=case["max_norm"], use_nvlamb=False)
        fused_lamb_cuda.lamb(2048, torch.zeros(1, dtype=torch.int), [grads, params, ms, vs], 0.02, 0.9, 0.999, 1e-6,
                             step, case["bias_correction"], case["wd"], case["grad_averaging"], case["mode"], norm,
                             case["max_norm"])
        for got, want in zip(grads, updates):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(params + ms + vs, want_p + want_m + want_v):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_an_infinite_norm_raises_the_noop_flag():
    params = [torch.ones(3)]
    flag = torch.zeros(1, dtype=torch.int)
    fused_lamb_cuda.lamb(2048, flag, [[torch.tensor([1.0, float("inf"), 0.0])], params, [torch.zeros(3)],
                                      [torch.zeros(3)]], 0.01, 0.9, 0.999, 1e-6, 1, 1, 0.01, 1, 1, 1.0, 1.0)
    assert flag.item() == 1
