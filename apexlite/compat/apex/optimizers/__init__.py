"""`apex.optimizers`: FusedAdam, FusedSGD, FusedLAMB, FusedNovoGrad, FusedAdagrad and FusedMixedPrecisionLamb
(apexlite's implementations, one module each as in apex), and the 2019 `FP16_Optimizer`, which apex
moved to apex.contrib.optimizers in 2019-10 and which 2019 scripts still import from here.
"""
from apexlite.compat.apex.contrib.optimizers.fp16_optimizer import FP16_Optimizer
from apexlite.compat.apex.optimizers.fused_adagrad import FusedAdagrad
from apexlite.compat.apex.optimizers.fused_adam import FusedAdam
from apexlite.compat.apex.optimizers.fused_lamb import FusedLAMB
from apexlite.compat.apex.optimizers.fused_mixed_precision_lamb import FusedMixedPrecisionLamb
from apexlite.compat.apex.optimizers.fused_novograd import FusedNovoGrad
from apexlite.compat.apex.optimizers.fused_sgd import FusedSGD

__all__ = ["FusedAdam", "FusedSGD", "FusedLAMB", "FusedNovoGrad", "FusedAdagrad", "FusedMixedPrecisionLamb",
           "FP16_Optimizer"]
