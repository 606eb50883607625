"""Sample arguments for every patched op: qualname -> builder of fp32 (args, kwargs).

Tests cast these inputs as each policy's scenario needs and compare the patched call bitwise
against the unpatched op run on hand-cast inputs.
"""
import torch
import torch.nn.functional as F


def r(*shape):
    return torch.randn(*shape)


def pos(*shape):
    """Values in (0.1, 0.9): inside the domain of every unary op in the tables."""
    return torch.rand(*shape) * 0.8 + 0.1


def sign(n):
    return torch.tensor([1.0, -1.0, 1.0][:n])


_CONV = {
    "conv1d": lambda: ((r(1, 2, 5), r(3, 2, 3)), {}),
    "conv2d": lambda: ((r(1, 2, 5, 5), r(3, 2, 3, 3)), {}),
    "conv3d": lambda: ((r(1, 2, 4, 4, 4), r(3, 2, 2, 2, 2)), {}),
    "conv_transpose1d": lambda: ((r(1, 2, 5), r(2, 3, 3)), {}),
    "conv_transpose2d": lambda: ((r(1, 2, 4, 4), r(2, 3, 3, 3)), {}),
    "conv_transpose3d": lambda: ((r(1, 2, 3, 3, 3), r(2, 3, 2, 2, 2)), {}),
    "conv_tbc": lambda: ((r(5, 1, 2), r(3, 2, 4), r(4), 1), {}),
    "prelu": lambda: ((r(4, 3), r(3)), {}),
}
_MATMUL = {
    "addmm": lambda: ((r(2, 4), r(2, 3), r(3, 4)), {}),
    "addmv": lambda: ((r(2), r(2, 3), r(3)), {}),
    "addr": lambda: ((r(2, 3), r(2), r(3)), {}),
    "matmul": lambda: ((r(2, 3), r(3, 4)), {}),
    "mm": lambda: ((r(2, 3), r(3, 4)), {}),
    "mv": lambda: ((r(2, 3), r(3)), {}),
    "addbmm": lambda: ((r(2, 4), r(3, 2, 3), r(3, 3, 4)), {}),
    "baddbmm": lambda: ((r(3, 2, 4), r(3, 2, 3), r(3, 3, 4)), {}),
    "bmm": lambda: ((r(3, 2, 3), r(3, 3, 4)), {}),
}
_UNARY = "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan".split()
_REDUCE = {
    "pow": lambda: ((pos(3, 4), 2), {}),
    "cumprod": lambda: ((pos(3, 4), 0), {}),
    "cumsum": lambda: ((pos(3, 4), 0), {}),
    "dist": lambda: ((pos(3, 4), pos(3, 4)), {}),
    "norm": lambda: ((pos(3, 4),), {}),
    "prod": lambda: ((pos(3, 4), 0), {}),  # over a dim: the form that also takes out=
    "std": lambda: ((pos(3, 4),), {}),
    "sum": lambda: ((pos(3, 4), 0), {}),
    "var": lambda: ((pos(3, 4),), {}),
    "renorm": lambda: ((r(3, 4), 2, 0, 1.0), {}),
    "softmax": lambda: ((r(3, 4), -1), {}),
    "log_softmax": lambda: ((r(3, 4), -1), {}),
}
_NORMS = {
    "layer_norm": lambda: ((r(2, 4), (4,)), {}),
    "group_norm": lambda: ((r(2, 4, 3), 2), {}),
    "cosine_similarity": lambda: ((r(3, 4), r(3, 4)), {}),
}
_LOSSES = {
    "poisson_nll_loss": lambda: ((r(3, 4), pos(3, 4)), {}),
    "cosine_embedding_loss": lambda: ((r(3, 4), r(3, 4), sign(3)), {}),
    "cross_entropy": lambda: ((r(3, 5), torch.tensor([1, 0, 4])), {}),
    "hinge_embedding_loss": lambda: ((r(3), sign(3)), {}),
    "kl_div": lambda: ((F.log_softmax(r(3, 4), -1), F.softmax(r(3, 4), -1)), {"reduction": "batchmean"}),
    "l1_loss": lambda: ((r(3, 4), r(3, 4)), {}),
    "mse_loss": lambda: ((r(3, 4), r(3, 4)), {}),
    "margin_ranking_loss": lambda: ((r(3), r(3), sign(3)), {}),
    "multilabel_margin_loss": lambda: ((r(2, 4), torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3]])), {}),
    "multilabel_soft_margin_loss": lambda: ((r(2, 4), (pos(2, 4) > 0.5).float()), {}),
    "multi_margin_loss": lambda: ((r(3, 5), torch.tensor([1, 0, 4])), {}),
    "nll_loss": lambda: ((F.log_softmax(r(3, 5), -1), torch.tensor([1, 0, 4])), {}),
    "binary_cross_entropy_with_logits": lambda: ((r(3, 4), pos(3, 4)), {}),
    "smooth_l1_loss": lambda: ((r(3, 4), r(3, 4)), {}),
    "soft_margin_loss": lambda: ((r(3), sign(3)), {}),
    "triplet_margin_loss": lambda: ((r(3, 4), r(3, 4), r(3, 4)), {}),
    "ctc_loss": lambda: (
        (F.log_softmax(r(6, 2, 4), -1), torch.tensor([[1, 2], [3, 1]]), torch.tensor([6, 6]),
         torch.tensor([2, 2])), {}),
    "huber_loss": lambda: ((r(3, 4), r(3, 4)), {}),
}
_PROMOTE = {
    "addcdiv": lambda: ((r(3), r(3), pos(3)), {}),
    "addcmul": lambda: ((r(3), r(3), r(3)), {}),
    "atan2": lambda: ((r(3), r(3)), {}),
    "cross": lambda: ((r(2, 3), r(2, 3)), {"dim": 1}),
    "bilinear": lambda: ((r(2, 3), r(2, 4), r(5, 3, 4), r(5)), {}),
    "dot": lambda: ((r(3), r(3)), {}),
    "equal": lambda: ((torch.ones(3), torch.ones(3)), {}),
    "tensordot": lambda: ((r(2, 3), r(3, 4)), {"dims": 1}),
    "scatter_add": lambda: ((r(5), 0, torch.tensor([0, 2, 4]), r(3)), {}),
    "index_put": lambda: ((r(5), (torch.tensor([1, 3]),), r(2)), {}),
}

CASES = {}
for _ns in ("torch", "torch.nn.functional"):
    CASES.update({f"{_ns}.{k}": v for k, v in _CONV.items()})
CASES.update({f"torch.{k}": v for k, v in _MATMUL.items()})
CASES.update({f"torch.Tensor.{k}": v for k, v in _MATMUL.items()})
CASES["torch.Tensor.prelu"] = _CONV["prelu"]
CASES["torch.Tensor.__matmul__"] = _MATMUL["mm"]
CASES["torch.chain_matmul"] = lambda: ((r(2, 3), r(3, 4), r(4, 2)), {})
CASES["torch.linalg.multi_dot"] = lambda: (([r(2, 3), r(3, 4), r(4, 2)],), {})
CASES["torch.einsum"] = lambda: (("bld,lrd->blr", r(2, 3, 4), r(3, 5, 4)), {})
CASES["torch.nn.functional.linear"] = lambda: ((r(4, 3), r(5, 3), r(5)), {})
CASES["torch.nn.functional.scaled_dot_product_attention"] = lambda: ((r(1, 2, 4, 8), r(1, 2, 4, 8), r(1, 2, 4, 8)), {})
for _ns in ("torch", "torch.Tensor"):
    CASES.update({f"{_ns}.{k}": (lambda: ((pos(3, 4),), {})) for k in _UNARY})
    CASES.update({f"{_ns}.{k}": v for k, v in _REDUCE.items()})
CASES.update({f"torch.{k}": v for k, v in _NORMS.items()})
CASES["torch.cdist"] = lambda: ((r(3, 4), r(2, 4)), {})
CASES.update({f"torch.nn.functional.{k}": v for k, v in {**_NORMS, **_LOSSES}.items()})
CASES.update({
    "torch.nn.functional.interpolate": lambda: ((r(1, 2, 4),), {"scale_factor": 2}),
    "torch.nn.functional.grid_sample": lambda: ((r(1, 1, 4, 4), torch.rand(1, 3, 3, 2) * 1.8 - 0.9), {"align_corners": False}),
    "torch.nn.functional.softplus": lambda: ((r(3, 4),), {}),
    "torch.nn.functional.softmin": lambda: ((r(3, 4),), {"dim": -1}),
    "torch.nn.functional.softmax": lambda: ((r(3, 4),), {"dim": -1}),
    "torch.nn.functional.log_softmax": lambda: ((r(3, 4),), {"dim": -1}),
    "torch.nn.functional.gelu": lambda: ((r(3, 4),), {}),
    "torch.nn.functional.local_response_norm": lambda: ((r(1, 4, 5), 2), {}),
    "torch.nn.functional.normalize": lambda: ((r(3, 4),), {}),
    "torch.nn.functional.pdist": lambda: ((r(4, 3),), {}),
    "torch.Tensor.__pow__": lambda: ((pos(3, 4), 2), {}),
    "torch.Tensor.__rpow__": lambda: ((pos(3, 4), 2), {}),
    "torch.Tensor.__ipow__": lambda: ((pos(3, 4), 2), {}),
    "torch.Tensor.__rtruediv__": lambda: ((pos(3, 4), 2.0), {}),
    "torch.Tensor.__rdiv__": lambda: ((pos(3, 4), 2.0), {}),
    "torch.Tensor.cpu": lambda: ((r(3, 4),), {}),
})
for _ns in ("torch", "torch.Tensor"):
    CASES.update({f"{_ns}.{k}": v for k, v in _PROMOTE.items() if not (_ns == "torch.Tensor" and k in ("bilinear", "tensordot"))})
CASES["torch.nn.functional.bilinear"] = _PROMOTE["bilinear"]
CASES["torch.cat"] = lambda: (([r(2, 3), r(1, 3)],), {})
CASES["torch.stack"] = lambda: (([r(2, 3), r(2, 3)],), {})
for _name in ("addmm", "addmv", "addr", "addbmm", "baddbmm"):
    CASES[f"torch.Tensor.{_name}_"] = _MATMUL[_name]
for _name in _UNARY + ["pow", "cumprod", "cumsum", "renorm"]:
    _base = CASES[f"torch.{_name}"]
    CASES[f"torch.Tensor.{_name}_"] = _base
    CASES[f"torch.{_name}_"] = _base
CASES["torch.nn.functional.binary_cross_entropy"] = lambda: ((pos(3, 4), pos(3, 4)), {})

# RNN entry points are exercised through nn.RNN/GRU/LSTM and the cells in test_rnn.py.
SAMPLED_ELSEWHERE = {"torch._VF"}
