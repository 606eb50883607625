"""`fused_weight_gradient_mlp_cuda`: the weight-gradient GEMMs that accumulate into Megatron's main_grad,
against torch autograd's weight gradient of a linear layer, added to what the buffer held."""
import pytest
import torch

from apexlite.compat import fused_weight_gradient_mlp_cuda as ext
from tests._helpers.tolerances import dtype_tols

IN, OUT = 6, 4


def _linear_weight_grad(x, upstream):
    """torch's weight gradient of y = x @ W^T in fp32: the reference."""
    weight = torch.zeros(OUT, IN, requires_grad=True)
    torch.nn.functional.linear(x.float(), weight).backward(upstream.float())
    return weight.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["float32", "float16",
                                                                                      "bfloat16"])
def test_fp32_main_grad_accumulates_the_weight_gradient(dtype):
    x = torch.randn(3, 5, IN).to(dtype)  # [sequence, batch, in]: leading dims flattened, as apex's view did
    upstream = torch.randn(3, 5, OUT).to(dtype)
    main_grad = torch.randn(OUT, IN)
    before = main_grad.clone()
    ext.wgrad_gemm_accum_fp32(x, upstream, main_grad)
    torch.testing.assert_close(main_grad, before + _linear_weight_grad(x, upstream), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_16bit_main_grad_accumulates_in_fp32_then_rounds(dtype):
    x, upstream = torch.randn(7, IN).to(dtype), torch.randn(7, OUT).to(dtype)
    main_grad = torch.randn(OUT, IN).to(dtype)
    want = (main_grad.float() + _linear_weight_grad(x, upstream)).to(dtype)
    ext.wgrad_gemm_accum_fp16(x, upstream, main_grad)
    assert main_grad.dtype is dtype
    torch.testing.assert_close(main_grad.float(), want.float(), **dtype_tols(dtype))


@pytest.mark.parametrize("call,message", [
    (lambda: ext.wgrad_gemm_accum_fp32(torch.randn(2, IN), torch.randn(2, OUT), torch.zeros(OUT, IN).half()),
     "d_weight must be float32"),
    (lambda: ext.wgrad_gemm_accum_fp16(torch.randn(2, IN), torch.randn(2, OUT), torch.zeros(OUT, IN)),
     "all be float16 or all bfloat16"),
    (lambda: ext.wgrad_gemm_accum_fp32(torch.randn(2, IN), torch.randn(3, OUT), torch.zeros(OUT, IN)),
     "same number of rows"),
])
def test_bad_arguments_raise_clearly(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()
