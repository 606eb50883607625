"""Keep torch.compile's graphs in step with O1's patches.

dynamo records a Tensor method or operator (`q @ k`, `.softmax(-1)`) as the plain op and guards nothing of
O1; the backend then traces that op through O1's patched method, so the compiled graph carries the casts
of whatever O1 state held when it was compiled, and keeps them when that state changes. So while O1 is
installed, and whenever it is installed, removed or changes its low dtype, dynamo's compiled code is
forgotten (recompiled on the next call), and AOTAutograd's on-disk cache, keyed by dynamo's graph, is off:
a graph with O1's casts must not be handed to another process's plain torch, nor one without to O1.
"""
from __future__ import annotations

import sys

from apexlite.amp.o1.patcher import Patcher


def forget_compiled_graphs() -> None:
    """Drop dynamo's compiled code (nothing to drop when torch.compile never ran in this process)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and hasattr(dynamo, "reset"):
        dynamo.reset()


def keep_graphs_in_step(patcher: Patcher) -> None:
    """Forget compiled graphs now and when the O1 patches are undone; keep the AOTAutograd cache off meanwhile."""
    import torch._functorch.config as aot_config  # a config module, cheap to import

    if hasattr(aot_config, "enable_autograd_cache"):
        previous = aot_config.enable_autograd_cache
        aot_config.enable_autograd_cache = False
        patcher.add_undo(lambda: setattr(aot_config, "enable_autograd_cache", previous),
                         "AOTAutograd's cache turned off (restored to %s)" % previous)
    patcher.add_undo(forget_compiled_graphs, "torch.compile's graphs forgotten")
    forget_compiled_graphs()
