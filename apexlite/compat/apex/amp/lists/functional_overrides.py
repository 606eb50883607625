"""`apex.amp.lists.functional_overrides`: apex's cast lists for torch.nn.functional.

The names are apex's; appending one registers it with apexlite's O1 (apexlite.compat.cast_lists).
"""
import sys

import torch.nn.functional

from apexlite.amp.o1.lists import BANNED_MESSAGES
from apexlite.amp.o1.policies import CastPolicy
from apexlite.compat.cast_lists import CastList, protect

MODULE = torch.nn.functional
_PREFIX = __name__.replace("apexlite.compat.", "")

FP16_FUNCS = CastList(f"{_PREFIX}.FP16_FUNCS", MODULE, CastPolicy.LOW_PRECISION, (
    "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d conv_tbc linear").split())

FP32_FUNCS = CastList(f"{_PREFIX}.FP32_FUNCS", MODULE, CastPolicy.FLOAT, (
    "interpolate grid_sample softplus softmin log_softmax softmax gelu layer_norm group_norm local_response_norm "
    "normalize cosine_similarity poisson_nll_loss cosine_embedding_loss cross_entropy hinge_embedding_loss kl_div "
    "l1_loss mse_loss margin_ranking_loss multilabel_margin_loss multilabel_soft_margin_loss multi_margin_loss "
    "nll_loss binary_cross_entropy_with_logits smooth_l1_loss soft_margin_loss triplet_margin_loss ctc_loss").split())

# (name, message) pairs, as apex held them; O1 refuses these for fp16/bf16 inputs.
BANNED_FUNCS = CastList(f"{_PREFIX}.BANNED_FUNCS", MODULE, None,
                        [("binary_cross_entropy", BANNED_MESSAGES["binary_cross_entropy"])])

protect(sys.modules[__name__])
