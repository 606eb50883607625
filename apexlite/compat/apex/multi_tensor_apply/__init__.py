"""`apex.multi_tensor_apply`: `multi_tensor_applier`, the MultiTensorApply instance apex's code calls ops through."""
from apexlite.compat.apex.multi_tensor_apply.multi_tensor_apply import DEFAULT_CHUNK_SIZE, MultiTensorApply

multi_tensor_applier = MultiTensorApply(DEFAULT_CHUNK_SIZE)

__all__ = ["MultiTensorApply", "multi_tensor_applier"]
