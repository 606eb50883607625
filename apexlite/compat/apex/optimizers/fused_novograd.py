"""`apex.optimizers.fused_novograd`: apex's FusedNovoGrad (apexlite's implementation, with apex's constructor and attributes)."""
import torch  # noqa: F401  (apex's module names)

from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier  # noqa: F401
from apexlite.optimizers.fused_novograd import FusedNovoGrad

__all__ = ["FusedNovoGrad"]
