"""torch.compile(fullgraph=True) of every fused norm against the same module run eagerly.

apex's own test_compile_fused_layer_norm/_rms_norm compare a compiled norm's forward and input
gradient with eager ones; torch 2.11 gave zero compiled input gradients for all four (kernels.py's
NOTE [no aliased returns]). Here every module and autograd Function, each dtype and both saving
modes are compiled with the "aot_eager" backend (the graph capture and autograd tracing that broke,
without a C++/Triton code generation step) and one case per norm with inductor, the default
backend. Forward, input gradient and parameter gradients must equal eager's to rounding.
"""
import itertools

import pytest
import torch
import torch._dynamo

from apexlite.compat.apex.normalization import fused_layer_norm as apex_fln
from apexlite.normalization import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm
from tests._helpers.torch_snapshot import warm_up_torch_compile

warm_up_torch_compile()

SHAPE = [32, 16]
# (name, module factory from memory_efficient)
MODULES = [
    ("layer_affine", lambda me: FusedLayerNorm(SHAPE, memory_efficient=me)),
    ("layer", lambda me: FusedLayerNorm(SHAPE, elementwise_affine=False, memory_efficient=me)),
    ("rms_affine", lambda me: FusedRMSNorm(SHAPE, memory_efficient=me)),
    ("rms", lambda me: FusedRMSNorm(SHAPE, elementwise_affine=False, memory_efficient=me)),
    ("mixed_layer", lambda me: MixedFusedLayerNorm(SHAPE, memory_efficient=me)),
    ("mixed_rms", lambda me: MixedFusedRMSNorm(SHAPE, memory_efficient=me)),
]
DTYPES = [torch.float32, torch.bfloat16]
CASES = list(itertools.product(MODULES, DTYPES, [False, True]))
IDS = [f"{m[0]}-{str(d)[6:]}-{'memeff' if me else 'saved_input'}" for m, d, me in CASES]


def _run(module, x, upstream, compiled_with=None):
    """(output, input grad, parameter grads) of one forward and backward, compiled or eager."""
    module.zero_grad(set_to_none=True)
    call = module if compiled_with is None else torch.compile(module, fullgraph=True, backend=compiled_with)
    leaf = x.detach().clone().requires_grad_(True)
    out = call(leaf)
    out.backward(upstream.to(out.dtype))
    return out.detach(), leaf.grad, [p.grad for p in module.parameters()]


def _assert_same(eager, compiled):
    out_e, grad_e, params_e = eager
    out_c, grad_c, params_c = compiled
    torch.testing.assert_close(out_c, out_e)
    assert grad_c is not None and grad_c.abs().sum() > 0, "compiled input gradient is missing or zero"
    torch.testing.assert_close(grad_c, grad_e)
    for got, want in zip(params_c, params_e):
        torch.testing.assert_close(got, want)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("norm,dtype,memory_efficient", CASES, ids=IDS)
def test_compiled_module_matches_eager_forward_and_backward(norm, dtype, memory_efficient):
    module = norm[1](memory_efficient)
    with torch.no_grad():  # non-trivial parameters, so a lost weight/bias gradient shows
        for p in module.parameters():
            p.copy_(torch.rand_like(p) + 0.5)
    x = torch.randn([4] + SHAPE).to(dtype)
    upstream = torch.rand([4] + SHAPE)
    _assert_same(_run(module, x, upstream), _run(module, x, upstream, compiled_with="aot_eager"))


@pytest.mark.slow
@pytest.mark.parametrize("norm", [MODULES[0], MODULES[1], MODULES[2], MODULES[3]], ids=lambda n: n[0])
def test_inductor_compiled_norm_matches_eager(norm):
    """apex's own test, on this device: torch.compile's default backend, fp32, saved input."""
    module = norm[1](False)
    x = torch.randn([16] + SHAPE)
    upstream = torch.rand([16] + SHAPE)
    _assert_same(_run(module, x, upstream), _run(module, x, upstream, compiled_with="inductor"))


# apex's operator-style forwards return the statistics too; all outputs go through the compiled graph.
STAT_FORWARDS = [
    ("layer_affine_fwd", lambda x, w, b: apex_fln.fused_layer_norm_affine_fwd(x, w, b, SHAPE, 1e-5)),
    ("layer_fwd", lambda x, w, b: apex_fln.fused_layer_norm_fwd(x, SHAPE, 1e-5)),
    ("rms_affine_fwd", lambda x, w, b: apex_fln.fused_rms_norm_affine_fwd(x, w, SHAPE, 1e-5)),
    ("rms_fwd", lambda x, w, b: apex_fln.fused_rms_norm_fwd(x, SHAPE, 1e-5)),
]


@pytest.mark.parametrize("name,forward", STAT_FORWARDS, ids=[f[0] for f in STAT_FORWARDS])
def test_compiled_statistics_forwards_match_eager(name, forward):
    x = torch.randn([4] + SHAPE)
    weight, bias = torch.rand(SHAPE) + 0.5, torch.rand(SHAPE)
    upstream = torch.rand([4] + SHAPE)

    def run(fn):
        leaf = x.clone().requires_grad_(True)
        outputs = fn(leaf, weight, bias)
        outputs[0].backward(upstream)
        return [o.detach() for o in outputs], leaf.grad

    eager_outs, eager_grad = run(forward)
    compiled_outs, compiled_grad = run(torch.compile(forward, fullgraph=True, backend="aot_eager"))
    for got, want in zip(compiled_outs, eager_outs):
        torch.testing.assert_close(got, want)
    assert compiled_grad.abs().sum() > 0
    torch.testing.assert_close(compiled_grad, eager_grad)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("norm", MODULES[:4], ids=lambda n: n[0])
def test_inductor_compiled_norm_matches_eager_on_cuda(norm):
    module = norm[1](False).cuda()
    x = torch.randn([16] + SHAPE, device="cuda")
    upstream = torch.rand([16] + SHAPE, device="cuda")
    _assert_same(_run(module, x, upstream), _run(module, x, upstream, compiled_with="inductor"))
