"""apexlite's fused optimizers (``from apexlite.optimizers import FusedAdam``)."""
from apexlite.optimizers._adam_step import fused_adam_step
from apexlite.optimizers.fused_adagrad import FusedAdagrad
from apexlite.optimizers.fused_adam import FusedAdam
from apexlite.optimizers.fused_lamb import FusedLAMB
from apexlite.optimizers.fused_mixed_precision_lamb import FusedMixedPrecisionLamb
from apexlite.optimizers.fused_novograd import FusedNovoGrad
from apexlite.optimizers.fused_sgd import FusedSGD

__all__ = ["FusedAdagrad", "FusedAdam", "FusedLAMB", "FusedMixedPrecisionLamb", "FusedNovoGrad", "FusedSGD",
           "fused_adam_step"]
