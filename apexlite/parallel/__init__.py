"""apexlite on torch.distributed: DDP with a gradient-communication dtype, FSDP helpers, SyncBatchNorm.

Names are loaded on first use, so `import apexlite` does not import torch's FSDP machinery (it imports
only `overflow`, which plugs the cross-rank overflow agreement into the amp layer).
See docs/distributed.md.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DistributedDataParallel": "ddp",
    "ddp_from_apex_args": "ddp",
    "broadcast_master_params": "ddp",
    "ReduceConfig": "comm_hooks",
    "reduce_hook": "comm_hooks",
    "sync_overflow": "overflow",
    "AllReduceOverflow": "overflow",
    "fully_shard": "fsdp",
    "initialize_fsdp": "fsdp",
    "check_fsdp_opt_level": "fsdp",
    "FSDP_OPT_LEVELS": "fsdp",
    "SyncBatchNorm": "syncbn",
    "convert_syncbn_model": "syncbn",
    "create_syncbn_process_group": "syncbn",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'apexlite.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"apexlite.parallel.{module}"), name)
    globals()[name] = value
    return value
