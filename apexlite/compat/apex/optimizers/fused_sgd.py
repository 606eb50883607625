"""`apex.optimizers.fused_sgd`: apex's FusedSGD (apexlite's implementation, with apex's constructor and attributes)."""
import torch  # noqa: F401  (apex's module names)
from torch.optim.optimizer import Optimizer, required  # noqa: F401

from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier  # noqa: F401
from apexlite.optimizers.fused_sgd import FusedSGD

__all__ = ["FusedSGD"]
