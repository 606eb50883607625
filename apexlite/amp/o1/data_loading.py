"""Keep O1's casts out of torch's DataLoader: batches come out as the data pipeline makes them without amp.

A dataset's `__getitem__` and a `collate_fn` may call patched ops (a matmul of an augmentation, a softmax of
soft labels, `torch.cat`). apex never cast them (it cast CUDA tensors only), and a script's data must not
depend on how its loader runs: in the main process (`num_workers=0`), in forked workers (which inherit the
patched torch) or in spawned ones (which import a torch without amp). torch runs every dataset read and
collate of all three through a fetcher's `fetch`; while O1 is installed each fetch runs in a casts-off
block of its thread (cast_state.py). Undone with the other O1 patches.
"""
from __future__ import annotations

from typing import Any, Callable

from apexlite.amp.o1.function_wrappers import make_function_wrapper
from apexlite.amp.o1.patcher import Patcher, raw_attribute

_FETCHERS = ("_MapDatasetFetcher", "_IterableDatasetFetcher")


def _without_casts(state: Any) -> Callable:
    def fetch_without_casts(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        with state.disabled():
            return wrapped(*args, **kwargs)

    return fetch_without_casts


def keep_casts_out_of_data_loading(patcher: Patcher, state: Any) -> None:
    """Run the DataLoader fetchers' `fetch` with O1 casts off (a torch without them has nothing to patch)."""
    try:
        from torch.utils.data._utils import fetch as fetch_module
    except ImportError:  # pragma: no cover - present in every supported torch
        return
    for name in _FETCHERS:
        fetcher = getattr(fetch_module, name, None)
        if fetcher is not None and "fetch" in vars(fetcher):
            patched = make_function_wrapper(raw_attribute(fetcher, "fetch"), _without_casts(state), (fetcher, "fetch"))
            patcher.set_attribute(fetcher, "fetch", patched)
