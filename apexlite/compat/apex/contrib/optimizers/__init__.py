"""`apex.contrib.optimizers`: apex's 2019 optimizer API (FP16_Optimizer, FusedAdam, FusedLAMB; FusedSGD in
its module), implemented on apexlite's optimizers and kernels."""
from apexlite.compat.apex.contrib.optimizers.fp16_optimizer import FP16_Optimizer
from apexlite.compat.apex.contrib.optimizers.fused_adam import FusedAdam
from apexlite.compat.apex.contrib.optimizers.fused_lamb import FusedLAMB

__all__ = ["FP16_Optimizer", "FusedAdam", "FusedLAMB"]
