"""O1 op tables as data: which torch callables are patched, and with which cast policy.

Each table maps a namespace to a space-separated list of attribute names. `op_entries()` turns the
tables into `OpEntry` records; nothing here is computed at import time from torch itself, so the
tables read exactly as they are applied. A test checks that every name resolves on the installed
torch (or carries a `min_torch` gate) and that no (namespace, name) appears under two policies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from apexlite.amp.o1.policies import CastPolicy

F = "torch.nn.functional"
T = "torch"
TENSOR = "torch.Tensor"
LINALG = "torch.linalg"
VF = "torch._VF"  # what nn.RNN/GRU/LSTM and the *Cell modules call (torch.nn.modules.rnn._VF)

_CONV = "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d conv_tbc"
_MATMUL = "addmm addmv addr matmul mm mv addbmm baddbmm bmm"
_FP32_MATH = (
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow "
    "cumprod cumsum dist norm prod std sum var renorm softmax log_softmax"
)
_FP32_INPLACE = (
    "acos_ asin_ cosh_ erfinv_ exp_ expm1_ log_ log10_ log2_ log1p_ reciprocal_ rsqrt_ sinh_ tan_ "
    "pow_ cumprod_ cumsum_ renorm_"
)
_LOSSES = (
    "poisson_nll_loss cosine_embedding_loss cross_entropy hinge_embedding_loss kl_div l1_loss mse_loss "
    "margin_ranking_loss multilabel_margin_loss multilabel_soft_margin_loss multi_margin_loss nll_loss "
    "binary_cross_entropy_with_logits smooth_l1_loss soft_margin_loss triplet_margin_loss ctc_loss "
    "huber_loss"
)

# policy -> namespace -> names. apex's lists, plus the ops torch.autocast's CUDA lists cast today
# (scaled_dot_product_attention, chain_matmul/multi_dot, log1p, cdist/pdist, softmax as a method, ...),
# and einsum, whose contractions autocast reaches through the bmm it decomposes into.
TABLES: Dict[CastPolicy, Dict[str, str]] = {
    CastPolicy.LOW_PRECISION: {
        F: f"{_CONV} linear prelu scaled_dot_product_attention",
        T: f"{_CONV} prelu {_MATMUL} chain_matmul einsum",
        TENSOR: f"__matmul__ prelu {_MATMUL}",
        LINALG: "multi_dot",
        VF: "lstm gru rnn_tanh rnn_relu lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell",
    },
    CastPolicy.FLOAT: {
        F: (
            "interpolate grid_sample softplus softmin log_softmax softmax gelu layer_norm group_norm "
            f"local_response_norm normalize cosine_similarity pdist {_LOSSES}"
        ),
        T: f"{_FP32_MATH} layer_norm group_norm cdist cosine_similarity",
        TENSOR: f"{_FP32_MATH} __pow__ __rpow__ __ipow__ __rtruediv__ __rdiv__ cpu",
    },
    CastPolicy.PROMOTE: {
        F: "bilinear",
        T: "addcdiv addcmul atan2 cross bilinear dot equal tensordot scatter_add index_put",
        TENSOR: "addcdiv addcmul atan2 cross dot equal scatter_add index_put",
    },
    CastPolicy.SEQUENCE_PROMOTE: {
        T: "cat stack",
    },
    CastPolicy.MATCH_SELF: {
        TENSOR: "addmm_ addmv_ addr_ addbmm_ baddbmm_",
    },
    CastPolicy.INPLACE_FLOAT: {
        T: "exp_ log_ log10_ log2_ log1p_ reciprocal_ rsqrt_ acos_ asin_ cosh_ sinh_ tan_",
        TENSOR: _FP32_INPLACE,
    },
    CastPolicy.BANNED: {
        F: "binary_cross_entropy",
    },
}

# Ops apex wrapped with promote/match-self casts that apexlite leaves alone, because torch's own
# type promotion already gives the widest (or self's) dtype with identical bits, without a Python
# wrapper on every arithmetic op. A test checks that claim op by op.
NATIVELY_PROMOTED: Dict[str, str] = {
    T: "add sub mul div eq ne ge gt le lt",
    TENSOR: (
        "add sub mul div eq ne ge gt le lt add_ sub_ mul_ div_ addcmul_ addcdiv_ atan2_ "
        "__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__ "
        "__truediv__ __itruediv__ __div__ __idiv__ __eq__ __ne__ __ge__ __gt__ __le__ __lt__"
    ),
}

# Names that exist only from a given torch version on: (namespace, name) -> (major, minor).
MIN_TORCH: Dict[Tuple[str, str], Tuple[int, int]] = {}

BANNED_MESSAGES: Dict[str, str] = {
    "binary_cross_entropy": (
        "\namp does not work out-of-the-box with `F.binary_cross_entropy` or `torch.nn.BCELoss.` "
        "It requires that the output of the previous function be already a FloatTensor. \n\n"
        "Most models have a Sigmoid right before BCELoss. In that case, you can use\n"
        "    torch.nn.BCEWithLogitsLoss\n"
        "to combine Sigmoid+BCELoss into a single layer that is compatible with amp.\n"
        "Another option is to add\n"
        "    amp.register_float_function(torch, 'sigmoid')\n"
        "before calling `amp.init()`.\n"
        "If you _really_ know what you are doing, you can disable this warning by passing allow_banned=True to "
        "`amp.init()`."
        # apex's text ends there (kept verbatim for log parsers); what applies to amp.initialize follows
        "\n\nWith amp.initialize: call amp.register_float_function(torch, 'sigmoid') before it, or run the loss "
        "in fp32 with amp.register_float_function(torch.nn.functional, 'binary_cross_entropy') before it."
    ),
}


@dataclass(frozen=True)
class OpEntry:
    """One patch target: `namespace.name` gets a wrapper for `policy`."""

    namespace: str
    name: str
    policy: CastPolicy
    min_torch: Optional[Tuple[int, int]] = None

    @property
    def qualname(self) -> str:
        return f"{self.namespace}.{self.name}"


def op_entries() -> List[OpEntry]:
    """Every patched op, flattened from TABLES in table order."""
    return [
        OpEntry(namespace, name, policy, MIN_TORCH.get((namespace, name)))
        for policy, by_namespace in TABLES.items()
        for namespace, names in by_namespace.items()
        for name in names.split()
    ]


def natively_promoted_entries() -> List[Tuple[str, str]]:
    """(namespace, name) pairs deliberately left to torch's type promotion."""
    return [(ns, name) for ns, names in NATIVELY_PROMOTED.items() for name in names.split()]
