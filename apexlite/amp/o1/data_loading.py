"""Keep O1's casts out of torch's DataLoader: batches come out as the data pipeline makes them without amp.

A dataset's `__getitem__` and a `collate_fn` may call patched ops (a matmul of an augmentation, a softmax of
soft labels, `torch.cat`). apex never cast them (it cast CUDA tensors only), and a script's data must not
depend on how its loader runs: in the main process (`num_workers=0`), in forked workers (which inherit the
patched torch) or in spawned ones (which import a torch without amp). torch runs every dataset read and
collate of all three through a fetcher (an IterableDataset's `__iter__` in its `__init__`, the rest in
`fetch`); while O1 is installed both run in a casts-off block of their thread (cast_state.py), a model
called by the dataset included. Undone with the other O1 patches.
"""
from __future__ import annotations

from typing import Any, Callable

from apexlite.amp.o1.function_wrappers import make_function_wrapper
from apexlite.amp.o1.patcher import Patcher, raw_attribute

# (fetcher class, method): an IterableDataset's __iter__ runs in the fetcher's __init__, the rest in fetch
_FETCHER_METHODS = (("_MapDatasetFetcher", "fetch"), ("_IterableDatasetFetcher", "__init__"),
                    ("_IterableDatasetFetcher", "fetch"))


def _without_casts(state: Any) -> Callable:
    def without_casts(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        with state.disabled():
            return wrapped(*args, **kwargs)

    return without_casts


def keep_casts_out_of_data_loading(patcher: Patcher, state: Any) -> None:
    """Run the DataLoader fetchers with O1 casts off (a torch without them has nothing to patch)."""
    try:
        from torch.utils.data._utils import fetch as fetch_module
    except ImportError:  # pragma: no cover - present in every supported torch
        return
    for name, method in _FETCHER_METHODS:
        fetcher = getattr(fetch_module, name, None)
        if fetcher is not None and method in vars(fetcher):
            patched = make_function_wrapper(raw_attribute(fetcher, method), _without_casts(state), (fetcher, method))
            patcher.set_attribute(fetcher, method, patched)
