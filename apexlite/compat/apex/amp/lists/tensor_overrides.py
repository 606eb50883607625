"""`apex.amp.lists.tensor_overrides`: apex's cast lists for torch.Tensor methods.

As in apex, each list is its own Tensor names plus those of torch_overrides' matching list that
torch.Tensor has. Appending a name registers it with apexlite's O1 (apexlite.compat.cast_lists).
"""
import sys

import torch

from apexlite.amp.o1.policies import CastPolicy
from apexlite.compat.apex.amp import compat
from apexlite.compat.apex.amp.lists import torch_overrides
from apexlite.compat.cast_lists import CastList, protect

MODULE = torch.Tensor
_PREFIX = __name__.replace("apexlite.compat.", "")


def _names(own: str, list_name: str) -> list:
    return compat.filter_attrs(MODULE, own.split()) + [
        name for name in getattr(torch_overrides, list_name) if hasattr(MODULE, name)]


FP16_FUNCS = CastList(f"{_PREFIX}.FP16_FUNCS", MODULE, CastPolicy.LOW_PRECISION, _names("__matmul__", "FP16_FUNCS"))
FP32_FUNCS = CastList(f"{_PREFIX}.FP32_FUNCS", MODULE, CastPolicy.FLOAT,
                      _names("__ipow__ __pow__ __rpow__ cpu", "FP32_FUNCS"))
CASTS = CastList(f"{_PREFIX}.CASTS", MODULE, CastPolicy.PROMOTE, _names(
    "__add__ __div__ __eq__ __ge__ __gt__ __iadd__ __idiv__ __imul__ __isub__ __itruediv__ __le__ __lt__ __mul__ "
    "__ne__ __radd__ __rdiv__ __rmul__ __rsub__ __rtruediv__ __sub__ __truediv__", "CASTS"))
SEQUENCE_CASTS = CastList(f"{_PREFIX}.SEQUENCE_CASTS", MODULE, CastPolicy.SEQUENCE_PROMOTE,
                          _names("", "SEQUENCE_CASTS"))

protect(sys.modules[__name__])
