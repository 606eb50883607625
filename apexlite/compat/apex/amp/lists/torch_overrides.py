"""`apex.amp.lists.torch_overrides`: apex's cast lists for torch's functions.

The names are apex's (batched matmuls join FP16_FUNCS on a CUDA build of torch, as apex put them);
appending one registers it with apexlite's O1 (apexlite.compat.cast_lists).
"""
import sys

import torch

from apexlite.amp.o1.policies import CastPolicy
from apexlite.compat.apex.amp import utils
from apexlite.compat.cast_lists import CastList, protect

MODULE = torch
_PREFIX = __name__.replace("apexlite.compat.", "")

version_strings = torch.__version__.split(".")
version_major = version_strings[0]
version_minor = version_strings[1]
version_num = float(f"{version_major}.{version_minor}")

_BATCHED_MATMULS = ["addbmm", "baddbmm", "bmm"]

FP16_FUNCS = CastList(f"{_PREFIX}.FP16_FUNCS", MODULE, CastPolicy.LOW_PRECISION, (
    "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d conv_tbc prelu "
    "addmm addmv addr matmul mm mv").split() + (_BATCHED_MATMULS if utils.is_cuda_enabled() else []))

FP32_FUNCS = CastList(f"{_PREFIX}.FP32_FUNCS", MODULE, CastPolicy.FLOAT, (
    "acos asin cosh erfinv exp expm1 log log10 log2 reciprocal rsqrt sinh tan pow "
    "cumprod cumsum dist norm prod std sum var renorm").split())

CASTS = CastList(f"{_PREFIX}.CASTS", MODULE, CastPolicy.PROMOTE, (
    "addcdiv addcmul atan2 cross bilinear dot add div mul eq equal ge gt le lt ne").split())

SEQUENCE_CASTS = CastList(f"{_PREFIX}.SEQUENCE_CASTS", MODULE, CastPolicy.SEQUENCE_PROMOTE, ["cat", "stack"])

protect(sys.modules[__name__])
