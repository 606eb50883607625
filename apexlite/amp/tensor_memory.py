"""Tensor memory of a run, measured so that it differs between opt levels.

Process RSS does not: it is dominated by the interpreter and torch's libraries and is the same at
every level. On CUDA the caching allocator keeps the peak of allocated bytes. CPU torch keeps no
allocator statistics, so one training step is observed instead (see StepMemoryProbe).
"""
from __future__ import annotations

import gc
from typing import Any, Dict, Iterable, List, Optional

import torch


def cuda_in_use() -> bool:
    """True when this process has initialised CUDA (so the CUDA allocator's peak is the measure)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _storage_key_and_bytes(tensor: torch.Tensor) -> Optional[tuple]:
    """(address, bytes) of a CPU tensor's storage; None for tensors without real CPU memory: sparse, nested,
    meta, and the functional wrappers torch.compile leaves alive, whose storage refuses its address."""
    try:
        storage = tensor.untyped_storage()
        if storage.device.type != "cpu":
            return None
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return None


def live_cpu_tensor_bytes() -> int:
    """Bytes of every CPU tensor storage reachable from Python (and those tensors' grads), each once."""
    storages: Dict[int, int] = {}
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor):  # type(), not isinstance: proxies fake __class__
            continue
        grad = obj.grad if obj.is_leaf else None  # a non-leaf's .grad is always None (and warns)
        for tensor in (obj, grad):
            found = _storage_key_and_bytes(tensor) if tensor is not None else None
            if found is not None and found[0]:
                storages[found[0]] = max(storages.get(found[0], 0), found[1])
    return sum(storages.values())


class StepMemoryProbe:
    """Peak tensor bytes of one CPU training step, from the profiler's allocation events.

    The profiler reports allocations made while it runs and their frees, but not the frees of
    tensors that existed before it started (old grads, the previous batch). So the peak is anchored
    at the end of the step: the live tensor bytes then, plus the most the step's own allocations
    stood above their level at the end. That is exact when the older tensors are freed before the
    peak (as zero_grad and a new batch do) and a lower bound otherwise.
    """

    def __init__(self) -> None:
        self.peak_bytes: Optional[int] = None
        self.error: Optional[str] = None
        self._profiler: Any = None

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        try:
            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.start()
        except Exception as error:  # e.g. the script runs its own profiler: report, do not disturb it
            self._profiler = None
            self.error = f"profiler unavailable: {type(error).__name__}: {error}"

    def stop(self) -> None:
        if self._profiler is None:
            return
        try:
            self._profiler.stop()
            events = sorted((event.start_ns(), event.nbytes())
                            for event in self._profiler.profiler.kineto_results.events()
                            if event.name() == "[memory]")
        except Exception as error:  # an older torch without these accessors
            self.error = f"profiler memory events unavailable: {type(error).__name__}: {error}"
            return
        finally:
            self._profiler = None
        running = peak = 0
        for _, nbytes in events:
            running += nbytes
            peak = max(peak, running)
        self.peak_bytes = live_cpu_tensor_bytes() + peak - running


def _tensor_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _unique(tensors: Iterable[torch.Tensor]) -> List[torch.Tensor]:
    seen: Dict[int, torch.Tensor] = {}
    for tensor in tensors:
        seen.setdefault(id(tensor), tensor)
    return list(seen.values())


def state_bytes_per_param(models: List[torch.nn.Module], optimizers: List[Any]) -> Optional[float]:
    """Bytes held per model parameter: weights, their grads, fp32 masters and their grads, optimizer state.

    Masters are the params an optimizer steps that are not model params (O2). Scalar state (Adam's
    step counters) is left out. None when the models have no parameters.
    """
    params = _unique(p for model in models for p in model.parameters())
    count = sum(p.numel() for p in params)
    if not count:
        return None
    model_ids = {id(p) for p in params}
    stepped = _unique(p for opt in optimizers for group in opt.param_groups for p in group["params"])
    masters = [p for p in stepped if id(p) not in model_ids]
    state = [value for opt in optimizers for per_param in opt.state.values() for value in per_param.values()
             if torch.is_tensor(value) and value.dim()]
    total = (_tensor_bytes(params) + _tensor_bytes(p.grad for p in params) + _tensor_bytes(masters)
             + _tensor_bytes(m.grad for m in masters) + _tensor_bytes(state))
    return total / count
