"""Identity snapshot of every attribute apexlite may patch, to prove tests leave torch as found."""
from __future__ import annotations

from typing import Any, Dict

import torch

from apexlite.amp.o1.lists import natively_promoted_entries, op_entries
from apexlite.amp.o1.patcher import resolve

ABSENT = object()


def _own_attribute(target: Any, name: str) -> Any:
    """What the target itself holds under `name` (ABSENT when inherited or dynamic)."""
    return vars(target).get(name, ABSENT)


def snapshot_patch_targets() -> Dict[str, Any]:
    pairs = [(e.namespace, e.name) for e in op_entries()] + natively_promoted_entries()
    pairs.append(("torch.nn.RNNBase", "check_input"))  # the O1 RNN input check (apexlite/amp/o1/rnn_input.py)
    pairs += [("torch.jit", name) for name in ("script", "trace", "trace_module")]  # apexlite/amp/o1/torchscript.py
    pairs += [(f"torch.utils.data._utils.fetch.{fetcher}", "fetch")  # apexlite/amp/o1/data_loading.py
              for fetcher in ("_MapDatasetFetcher", "_IterableDatasetFetcher")]
    pairs.append(("torch.utils.data._utils.fetch._IterableDatasetFetcher", "__init__"))
    pairs.append(("torch.nn.Module", "_apply"))  # apexlite/amp/o1/device_scope.py follows model moves
    snapshot = {}
    for namespace, name in pairs:
        snapshot[f"{namespace}.{name}"] = _own_attribute(resolve(namespace), name)
    # O1's switch of torch's fused transformer path (apexlite/amp/o1/transformer_fast_path.py); a bool, so `is` holds
    snapshot["torch.backends.mha fast path"] = torch.backends.mha.get_fastpath_enabled()
    return snapshot


def unchanged_since(before: Dict[str, Any]) -> bool:
    """True when every patch target still holds the very object it held in `before` (compared with `is`)."""
    after = snapshot_patch_targets()
    return after.keys() == before.keys() and all(after[key] is value for key, value in before.items())


def warm_up_torch_compile() -> None:
    """Run torch.compile once, at import of a test module that compiles: torch's first compiled call
    wraps torch.jit.trace/trace_module itself, which the patch guard would otherwise blame on a test."""
    import torch

    torch.compile(lambda t: t + 1, backend="aot_eager")(torch.ones(1))
