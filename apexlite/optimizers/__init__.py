"""apexlite's fused optimizers (``from apexlite.optimizers import FusedAdam``)."""
from apexlite.optimizers._adam_step import fused_adam_step
from apexlite.optimizers.fused_adam import FusedAdam

__all__ = ["FusedAdam", "fused_adam_step"]
