"""References and inputs for the LayerNorm/RMSNorm tests: torch's layer norm in fp32 and an fp64 RMSNorm."""
import torch
import torch.nn.functional as F

from tests._helpers.tolerances import dtype_tols

SHAPE = (6, 8)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# memory_efficient recovers the normalised values from the saved low-precision output, as apex did,
# so its gradients carry that output's rounding (an ulp of the output, over |weight|, summed over rows).
MEMORY_EFFICIENT_SLACK = 4


def inputs(dtype, affine, batch=(4, 3)):
    """(x, weight, bias): x of shape batch + SHAPE in `dtype`; fp32 weight of both signs and bias (or None)."""
    x = (torch.randn(*batch, *SHAPE) * 3 + 1).to(dtype)
    weight = (torch.rand(SHAPE) + 0.5) * torch.where(torch.rand(SHAPE) > 0.5, 1.0, -1.0) if affine else None
    bias = torch.randn(SHAPE) if affine else None
    return x, weight, bias


def grad_out(shape, dtype=torch.float32, seed=7):
    """An upstream gradient whose values the low-precision dtype holds exactly (both sides see the same)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype).float()


def layer_norm_ref(x, weight, bias, eps, shape=SHAPE):
    """torch's layer norm in fp32 (fp64 stays fp64): the fp32-statistics reference."""
    dtype = torch.float64 if x.dtype is torch.float64 else torch.float32
    cast = (lambda t: None if t is None else t.to(dtype))
    return F.layer_norm(x.to(dtype), shape, cast(weight), cast(bias), eps)


def rms_ref(x, weight, bias, eps, shape=SHAPE):
    """RMSNorm in fp64 (bias unused): x / sqrt(mean(x^2) + eps) * weight."""
    x = x.double()
    dims = tuple(range(-len(shape), 0))
    y = x * torch.rsqrt(x.square().mean(dims, keepdim=True) + eps)
    return y if weight is None else y * weight.double()


def grads(fn, x, weight, bias, upstream):
    """(output, d input, d weight, d bias) of fn on fresh leaf copies."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (x, weight, bias)]
    out = fn(*leaves)
    out.backward(upstream.to(out.dtype))
    return (out.detach(), *[None if t is None else t.grad for t in leaves])


def check_against(ours, reference, dtype, memory_efficient=False):
    """Output and gradients within `dtype`'s tolerance (gradients wider under low-precision memory_efficient)."""
    output_tols = dtype_tols(dtype)
    grad_tols = dict(output_tols)
    if memory_efficient and dtype is not torch.float32:
        grad_tols["atol"] *= MEMORY_EFFICIENT_SLACK
    for index, (got, want) in enumerate(zip(ours, reference)):
        if want is None:
            assert got is None
            continue
        torch.testing.assert_close(got.float(), want.float(), **(output_tols if index == 0 else grad_tols))
