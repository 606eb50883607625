"""apex's Megatron softmax extensions (`scaled_softmax_cuda`, `scaled_masked_softmax_cuda`,
`generic_scaled_masked_softmax_cuda`, `scaled_upper_triang_masked_softmax_cuda`) against torch.softmax in
fp32 with the mask applied by masked_fill, and its autograd; apex's checks, in-place backwards, fully
masked rows and `get_batch_per_block`."""
import pytest
import torch

from apexlite.compat import (
    generic_scaled_masked_softmax_cuda, scaled_masked_softmax_cuda, scaled_softmax_cuda,
    scaled_upper_triang_masked_softmax_cuda,
)
from tests._helpers.tolerances import dtype_tols

SHAPE = (2, 3, 8, 8)  # batches, heads, queries, keys
SCALE = 0.3  # not exact in fp16/bf16: the kernels take it rounded to the input's dtype
DTYPES = [torch.float16, torch.bfloat16]


def _mask(batches=2):
    generator = torch.Generator().manual_seed(5)
    mask = torch.rand(batches, 1, SHAPE[2], SHAPE[3], generator=generator) < 0.3
    mask[0, 0, 1, :] = True  # a fully masked row
    return mask


def _reference(x, scale, mask=None, causal=False):
    """torch.softmax of the fp32 scores, masked: -inf above the diagonal, -10000 where the mask is set, and 0
    for a row whose every score is masked. Returns (probabilities, the fp32 leaf they were computed from)."""
    leaf = x.float().requires_grad_()
    scores = leaf * float(torch.tensor(scale, dtype=x.dtype))
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if mask is None:
        return torch.softmax(scores, -1), leaf
    scores = scores.masked_fill(mask, -10000.0)
    return torch.softmax(scores, -1) * (~mask).any(-1, keepdim=True), leaf


# (name, forward, backward, input shape, builds the mask or None, causal, backward writes in place)
KERNELS = [
    ("scaled_softmax", scaled_softmax_cuda.forward, scaled_softmax_cuda.backward, SHAPE, None, False, True),
    ("scaled_masked_softmax", scaled_masked_softmax_cuda.forward, scaled_masked_softmax_cuda.backward, SHAPE,
     _mask, False, False),
    ("scaled_masked_softmax_shared_mask", scaled_masked_softmax_cuda.forward, scaled_masked_softmax_cuda.backward,
     SHAPE, lambda: _mask(batches=1), False, False),
    ("generic_scaled_masked_softmax", generic_scaled_masked_softmax_cuda.forward,
     generic_scaled_masked_softmax_cuda.backward, SHAPE, _mask, False, False),
    ("scaled_upper_triang_masked_softmax", scaled_upper_triang_masked_softmax_cuda.forward,
     scaled_upper_triang_masked_softmax_cuda.backward, (6, 8, 8), None, True, True),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d)[6:] for d in DTYPES])
@pytest.mark.parametrize("name,forward,backward,shape,make_mask,causal,in_place", KERNELS, ids=[k[0] for k in KERNELS])
def test_forward_and_backward_match_torch_softmax(name, forward, backward, shape, make_mask, causal, in_place, dtype):
    x = (torch.randn(shape) * 4).to(dtype)
    mask = make_mask() if make_mask else None
    out = forward(x, SCALE) if mask is None else forward(x, mask, SCALE)
    want, leaf = _reference(x, SCALE, None if mask is None else mask.expand(shape), causal)
    assert out.dtype is dtype and out.shape == x.shape and not out.requires_grad
    torch.testing.assert_close(out.float(), want.detach().to(dtype).float(), **dtype_tols(dtype))
    if mask is not None:
        assert not out[0, :, 1].any()  # the fully masked row

    upstream = torch.randn(shape).to(dtype)
    grads = upstream.clone()
    got = backward(grads, out, SCALE)
    assert (got is grads) == in_place  # apex wrote these backwards into output_grads
    # the reference backward from the same low-precision output, in fp32
    y = out.float()
    expected = SCALE * y * (upstream.float() - (upstream.float() * y).sum(-1, keepdim=True))
    torch.testing.assert_close(got.float(), expected.to(dtype).float(), **dtype_tols(dtype))
    # and against autograd of the fp32 reference (the difference: the forward's rounding)
    want.backward(upstream.float())
    torch.testing.assert_close(got.float(), leaf.grad / float(torch.tensor(SCALE, dtype=dtype)) * SCALE,
                               rtol=2e-2, atol=2e-2)


def test_the_masked_kernels_differ_only_in_their_fully_masked_row_test():
    """A row whose unmasked scores all lie below -10000: the generic kernel zeroes it, the other does not."""
    x = torch.full((1, 1, 2, 4), -20000.0, dtype=torch.bfloat16)
    mask = torch.zeros(1, 1, 2, 4, dtype=torch.bool)
    assert torch.allclose(scaled_masked_softmax_cuda.forward(x, mask, 1.0).float(), torch.full((1, 1, 2, 4), 0.25))
    assert not generic_scaled_masked_softmax_cuda.forward(x, mask, 1.0).any()


def test_a_mask_of_ones_that_is_not_boolean_counts_only_where_it_is_one():
    x = torch.randn(1, 1, 2, 4).half()
    mask = torch.tensor([0, 1, 2, 1], dtype=torch.uint8).expand(1, 1, 2, 4)
    out = scaled_masked_softmax_cuda.forward(x, mask, 1.0)
    assert not out[..., 1].any() and not out[..., 3].any() and out[..., 2].all()


@pytest.mark.parametrize("sq,sk,b,np,expected", [(8, 8, 2, 3, 32), (128, 128, 1, 1, 8), (64, 256, 4, 2, 4),
                                                 (32, 2048, 1, 1, 4), (16, 20, 1, 1, 8)])
def test_get_batch_per_block_is_apexs_launch_arithmetic(sq, sk, b, np, expected):
    """128 threads a block, one warp (32, or the keys' next power of two if smaller) a row, two rows a warp
    up to 128 keys."""
    assert scaled_masked_softmax_cuda.get_batch_per_block(sq, sk, b, np) == expected


@pytest.mark.parametrize("call,message", [
    (lambda: scaled_softmax_cuda.forward(torch.randn(2, 4, 4).half(), 1.0), "expected 4D tensor"),
    (lambda: scaled_upper_triang_masked_softmax_cuda.forward(torch.randn(2, 4, 4), 1.0),
     "Only fp16 and bf16 are supported"),
    (lambda: scaled_masked_softmax_cuda.forward(torch.randn(2, 1, 4, 4).half(), torch.zeros(3, 1, 4, 4), 1.0),
     "the mask must have shape"),
])
def test_apexs_argument_checks(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()
