"""Run a worker function on 2 real processes (gloo, 127.0.0.1) and collect what each rank returns.

Each rank calls `worker(rank, world_size, *args)` inside an initialised process group and returns
a picklable result; the parent gets the list ordered by rank. A hard timeout kills the ranks.
"""
from __future__ import annotations

import gc
import os
import pickle
import socket
import sys
import tempfile
import time
from typing import Any, Callable, List

import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, outdir: str, worker: Callable, args: tuple) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        result = worker(rank, world_size, *args)
        with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as handle:
            pickle.dump(result, handle)
        # no rank tears gloo down while its peer may still be inside a collective
        dist.barrier()
    finally:
        gc.collect()
        dist.destroy_process_group()
    # Skip interpreter teardown: gloo/DDP C++ threads destroyed in arbitrary order at exit can abort
    # a rank whose work (and result file) is already complete.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(worker: Callable, *args: Any, world_size: int = 2, timeout: float = 60.0) -> List[Any]:
    """Spawn `world_size` ranks running `worker`; return their results (raises on failure/timeout)."""
    with tempfile.TemporaryDirectory() as outdir:
        context = mp.start_processes(_entry, args=(world_size, _free_port(), outdir, worker, args),
                                     nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                raise TimeoutError(f"{worker.__name__} did not finish within {timeout} s")
        results = []
        for rank in range(world_size):
            with open(os.path.join(outdir, f"rank{rank}.pkl"), "rb") as handle:
                results.append(pickle.load(handle))
        return results
