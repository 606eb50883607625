"""Megatron-LM's (2022-23) uses of apex's extension modules, written the way Megatron wrote them.

- its fused layer norm: `importlib.import_module("fused_layer_norm_cuda")` in the layer's constructor
  (bound to a global), `forward_affine` and the eight-argument `backward_affine` in an autograd Function;
- its fused softmax: `is_kernel_available` asks `scaled_masked_softmax_cuda.get_batch_per_block`, and the
  autograd Functions import `scaled_upper_triang_masked_softmax_cuda` / `scaled_masked_softmax_cuda` in
  their forward and backward (fp16 scores);
- its gradient accumulation fusion: the linear layer's backward calls
  `fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(input, grad_output, weight.main_grad)`.

Run as `python megatron_fused_kernels.py [--install]` (with --install the script calls apexlite.install()
first; otherwise apex must already resolve: `python -m apexlite run`, or the alias). Prints one JSON line:
the modules that answered and, per check, the largest difference from torch's own ops (fp32 references).
"""
import importlib
import json
import numbers
import sys

import torch

if "--install" in sys.argv:
    import apexlite

    apexlite.install()

fused_layer_norm_extension = None


# --- the fused layer norm -------------------------------------------------------------------------------
class FusedLayerNormAffineFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps):
        ctx.normalized_shape = normalized_shape
        ctx.eps = eps
        input_, weight_, bias_ = input.contiguous(), weight.contiguous(), bias.contiguous()
        output, mean, invvar = fused_layer_norm_extension.forward_affine(input_, ctx.normalized_shape, weight_,
                                                                         bias_, ctx.eps)
        ctx.save_for_backward(input_, weight_, bias_, mean, invvar)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input_, weight_, bias_, mean, invvar = ctx.saved_tensors
        grad_input, grad_weight, grad_bias = fused_layer_norm_extension.backward_affine(
            grad_output.contiguous(), mean, invvar, input_, ctx.normalized_shape, weight_, bias_, ctx.eps)
        return grad_input, grad_weight, grad_bias, None, None


class MixedFusedLayerNorm(torch.nn.Module):

    def __init__(self, normalized_shape, eps=1e-5):
        super().__init__()
        global fused_layer_norm_extension
        fused_layer_norm_extension = importlib.import_module("fused_layer_norm_cuda")
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = torch.Size(normalized_shape)
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.empty(*normalized_shape))
        self.bias = torch.nn.Parameter(torch.empty(*normalized_shape))
        torch.nn.init.normal_(self.weight, 1.0, 0.2)
        torch.nn.init.normal_(self.bias, 0.0, 0.2)

    def forward(self, input):
        return FusedLayerNormAffineFunction.apply(input, self.weight, self.bias, self.normalized_shape, self.eps)


# --- the fused softmax ----------------------------------------------------------------------------------
class ScaledUpperTriangMaskedSoftmax(torch.autograd.Function):

    @staticmethod
    def forward(ctx, inputs, scale):
        import scaled_upper_triang_masked_softmax_cuda

        scale_t = torch.tensor([scale])
        softmax_results = scaled_upper_triang_masked_softmax_cuda.forward(inputs, scale_t[0])
        ctx.save_for_backward(softmax_results, scale_t)
        return softmax_results

    @staticmethod
    def backward(ctx, output_grads):
        import scaled_upper_triang_masked_softmax_cuda

        softmax_results, scale_t = ctx.saved_tensors
        return scaled_upper_triang_masked_softmax_cuda.backward(output_grads, softmax_results, scale_t[0]), None


class ScaledMaskedSoftmax(torch.autograd.Function):

    @staticmethod
    def forward(ctx, inputs, mask, scale):
        import scaled_masked_softmax_cuda

        scale_t = torch.tensor([scale])
        softmax_results = scaled_masked_softmax_cuda.forward(inputs, mask, scale_t[0])
        ctx.save_for_backward(softmax_results, scale_t)
        return softmax_results

    @staticmethod
    def backward(ctx, output_grads):
        import scaled_masked_softmax_cuda

        softmax_results, scale_t = ctx.saved_tensors
        return scaled_masked_softmax_cuda.backward(output_grads, softmax_results, scale_t[0]), None, None


def is_kernel_available(b, np, sq, sk, causal):
    import scaled_masked_softmax_cuda

    attn_batches = b * np
    if 16 < sk <= 4096 and sq % 4 == 0 and sk % 4 == 0 and attn_batches % 4 == 0:
        batch_per_block = scaled_masked_softmax_cuda.get_batch_per_block(sq, sk, b, np)
        return (attn_batches if causal else sq) % batch_per_block == 0
    return False


# --- gradient accumulation fusion -----------------------------------------------------------------------
class LinearWithGradAccumulation(torch.autograd.Function):

    @staticmethod
    def forward(ctx, input, weight):
        ctx.save_for_backward(input, weight)
        return torch.matmul(input, weight.t())

    @staticmethod
    def backward(ctx, grad_output):
        import fused_weight_gradient_mlp_cuda

        input, weight = ctx.saved_tensors
        fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(input, grad_output, weight.main_grad)
        return torch.matmul(grad_output, weight), None


def _max_difference(got, want):
    return float((got.float() - want.float()).abs().max())


def layer_norm_differences():
    layer = MixedFusedLayerNorm(16)
    x = torch.randn(4, 3, 16, requires_grad=True)
    upstream = torch.randn(4, 3, 16)
    out = layer(x)
    out.backward(upstream)
    x_ref, w_ref, b_ref = (t.detach().clone().requires_grad_() for t in (x, layer.weight, layer.bias))
    reference = torch.nn.functional.layer_norm(x_ref, (16,), w_ref, b_ref, 1e-5)
    reference.backward(upstream)
    return max(_max_difference(got, want) for got, want in (
        (out, reference), (x.grad, x_ref.grad), (layer.weight.grad, w_ref.grad), (layer.bias.grad, b_ref.grad)))


def softmax_differences(causal):
    b, np, sq, sk = 4, 2, 32, 32
    assert is_kernel_available(b, np, sq, sk, causal)
    scores = (torch.randn(b, np, sq, sk) * 3).half()
    mask = torch.rand(b, 1, sq, sk) < 0.2
    upstream = torch.randn(b, np, sq, sk).half()
    x = scores.clone().requires_grad_()
    if causal:
        out = ScaledUpperTriangMaskedSoftmax.apply(x.view(-1, sq, sk), 0.125).view(b, np, sq, sk)
        filler = torch.ones(sq, sk, dtype=torch.bool).triu(1)
    else:
        out = ScaledMaskedSoftmax.apply(x, mask, 0.125)
        filler = mask
    out.backward(upstream.clone())  # the causal kernel's backward writes into the gradient it is given
    x_ref = scores.float().requires_grad_()
    reference = torch.softmax((x_ref * 0.125).masked_fill(filler, float("-inf")), dim=-1)
    reference.backward(upstream.float())
    return max(_max_difference(out, reference), _max_difference(x.grad, x_ref.grad))


def grad_accumulation_difference():
    x = torch.randn(5, 3, 8, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(6, 8))
    weight.main_grad = torch.randn(6, 8)
    before = weight.main_grad.clone()
    LinearWithGradAccumulation.apply(x, weight).sum().backward()
    w_ref = weight.detach().clone().requires_grad_()
    torch.nn.functional.linear(x.detach(), w_ref).sum().backward()
    return _max_difference(weight.main_grad, before + w_ref.grad)


def main():
    torch.manual_seed(0)
    differences = {"layer_norm": layer_norm_differences(), "causal_softmax": softmax_differences(causal=True),
                   "masked_softmax": softmax_differences(causal=False),
                   "grad_accumulation": grad_accumulation_difference()}
    modules = sorted(module.__name__ for name, module in sys.modules.items()
                     if name in ("fused_layer_norm_cuda", "scaled_upper_triang_masked_softmax_cuda",
                                 "scaled_masked_softmax_cuda", "fused_weight_gradient_mlp_cuda"))
    print(json.dumps({"modules": modules, "differences": differences}))


if __name__ == "__main__":
    main()
