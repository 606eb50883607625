"""`apex.parallel`: DistributedDataParallel, Reducer, SyncBatchNorm, convert_syncbn_model, LARC."""
from torch.distributed import ReduceOp  # noqa: F401

from apexlite.compat import generic
from apexlite.compat.apex.parallel.LARC import LARC  # noqa: F401
from apexlite.compat.apex.parallel.distributed import DistributedDataParallel, Reducer  # noqa: F401
from apexlite.compat.apex.parallel.sync_batchnorm import (  # noqa: F401
    SyncBatchNorm, convert_syncbn_model, create_syncbn_process_group,
)

__all__ = ["DistributedDataParallel", "Reducer", "SyncBatchNorm", "convert_syncbn_model",
           "create_syncbn_process_group", "ReduceOp", "LARC"]
__getattr__ = generic.fallback_getattr(__name__)
