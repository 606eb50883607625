"""`apex.optimizers.fused_mixed_precision_lamb`: apex's FusedMixedPrecisionLamb (apexlite's implementation,
with apex's constructor and attributes)."""
from collections import abc as container_abcs, defaultdict  # noqa: F401  (apex's module names)
from copy import deepcopy  # noqa: F401
from itertools import chain  # noqa: F401

import torch  # noqa: F401

from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier  # noqa: F401
from apexlite.optimizers.fused_mixed_precision_lamb import FusedMixedPrecisionLamb

__all__ = ["FusedMixedPrecisionLamb"]
