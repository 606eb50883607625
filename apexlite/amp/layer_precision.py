"""LayerDtypes: which dtype each Linear and convolution layer returned during a run, for `migrate --verify`.

Two runs whose losses agree can still differ in precision (a forward the migration left in float32); this
count shows it. `migrate --verify` sets APEXLITE_LAYER_DTYPES=FILE for both runs; `install_from_environment`
registers one process-wide forward hook and writes the counts to FILE at exit.

This file imports only the standard library, and torch when it installs: verify_child.py loads it by path
in runs where apexlite itself may not be imported, and `apexlite run` reads its switch before the script.
"""
from __future__ import annotations

import atexit
import json
import os
from typing import Any, Dict, Optional

LAYER_DTYPES_ENV = "APEXLITE_LAYER_DTYPES"
LOW_PRECISION = ("torch.float16", "torch.bfloat16")
TRAINING, NO_GRAD = "training", "no_grad"  # forwards with autograd recording, and without (evaluation, a teacher)


class LayerDtypes:
    """Counts, by grad mode, the output dtypes of every Linear/Conv forward while installed."""

    def __init__(self) -> None:
        self.counts: Dict[str, Dict[str, int]] = {TRAINING: {}, NO_GRAD: {}}
        self._handle: Optional[Any] = None
        self._torch: Any = None
        self._layers: tuple = ()

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        torch = self._torch
        if isinstance(module, self._layers) and isinstance(output, torch.Tensor):
            mode = TRAINING if torch.is_grad_enabled() else NO_GRAD
            key = str(output.dtype)
            self.counts[mode][key] = self.counts[mode].get(key, 0) + 1

    def install(self) -> None:
        import torch

        self._torch, self._layers = torch, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)
        self._handle = torch.nn.modules.module.register_module_forward_hook(self._hook)

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def write(self, path: str) -> None:
        partial = path + ".partial"
        with open(partial, "w") as handle:
            json.dump(self.counts, handle)
        os.replace(partial, path)


def install_from_environment() -> Optional[LayerDtypes]:
    """With APEXLITE_LAYER_DTYPES=FILE, count from now on and write FILE at exit. The variable is taken out of
    the environment, so this process counts once (verify_child.py under `apexlite run` asks again) and the
    processes it starts do not write the same FILE."""
    path = os.environ.pop(LAYER_DTYPES_ENV, None)
    if not path:
        return None
    counter = LayerDtypes()
    counter.install()

    def finish() -> None:
        counter.uninstall()
        counter.write(path)

    atexit.register(finish)
    return counter


def low_share(counts: Dict[str, int]) -> Optional[float]:
    """The fraction of counted outputs in float16/bfloat16; None when no layer ran."""
    total = sum(counts.values())
    return None if total == 0 else sum(counts.get(name, 0) for name in LOW_PRECISION) / total
