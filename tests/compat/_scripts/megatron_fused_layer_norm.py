"""A fused layer norm written the way Megatron-LM wrote it in 2022-23, against apex's extension module.

The module is imported by its top-level name with importlib in the layer's constructor (bound to a
global), and the autograd Function calls `forward_affine` and the eight-argument `backward_affine`.
Run as `python megatron_fused_layer_norm.py [--install]` (with --install the script calls
apexlite.install() first; otherwise apex must already resolve: `python -m apexlite run`, or the alias).
Prints one JSON line: the module that answered and the largest differences from torch's layer norm in
the output and in every gradient.
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


def main():
    torch.manual_seed(0)
    layer = MixedFusedLayerNorm(16)
    x = torch.randn(4, 3, 16, requires_grad=True)
    upstream = torch.randn(4, 3, 16)
    out = layer(x)
    out.backward(upstream)
    x_ref = x.detach().clone().requires_grad_()
    w_ref = layer.weight.detach().clone().requires_grad_()
    b_ref = layer.bias.detach().clone().requires_grad_()
    reference = torch.nn.functional.layer_norm(x_ref, (16,), w_ref, b_ref, 1e-5)
    reference.backward(upstream)
    differences = {name: float((got - want).abs().max()) for name, got, want in (
        ("output", out, reference), ("grad_input", x.grad, x_ref.grad), ("grad_weight", layer.weight.grad, w_ref.grad),
        ("grad_bias", layer.bias.grad, b_ref.grad))}
    print(json.dumps({"module": fused_layer_norm_extension.__name__, "differences": differences}))


if __name__ == "__main__":
    main()
