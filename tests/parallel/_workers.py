"""Code run inside the spawned ranks (and, for references, in the test process itself).

Models and data are tiny and seeded; every rank trains on its half of each global batch, the
single-process reference on the whole batch, so DDP's averaged gradient equals the reference's.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from apexlite import amp
from apexlite.compat.apex.parallel.distributed import DistributedDataParallel as ApexDDP
from apexlite.optimizers import FusedAdam
from apexlite.parallel import DistributedDataParallel, sync_overflow

GLOBAL_BATCH = 8
STEPS = 4
# A rank's half batch doubles each sample's share of the mean loss, so at 2**16 its fp16 backward
# can overflow where the full-batch reference does not; a lower ceiling keeps both overflow-free.
AMP_KWARGS = dict(verbosity=0, max_loss_scale=2.0 ** 12)


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def batches(steps: int = STEPS, seed: int = 1) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(GLOBAL_BATCH, 4, generator=gen), torch.randn(GLOBAL_BATCH, 2, generator=gen))
            for _ in range(steps)]


def shard(batch: Tuple[torch.Tensor, torch.Tensor], rank: int, world: int) -> Tuple[torch.Tensor, torch.Tensor]:
    size = GLOBAL_BATCH // world
    return tuple(t[rank * size:(rank + 1) * size] for t in batch)


def fp32_params(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Params as fp32 copies (the amp state-dict hook makes O2/O3 state dicts fp32)."""
    module = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def train_step(model, optimizer, x, y) -> float:
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def single_process_run(opt_level: str, steps: int = STEPS) -> Dict[str, torch.Tensor]:
    """The reference: one process, the full batch, the same opt level."""
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, **AMP_KWARGS)
    try:
        for x, y in batches(steps):
            train_step(model, optimizer, x, y)
        return fp32_params(model)
    finally:
        amp.deinitialize()


def ddp_opt_levels(rank: int, world: int, levels: List[str]) -> Dict[str, Dict[str, torch.Tensor]]:
    """Each level under torch's DDP; O2 also under apexlite's DDP with a different init per rank."""
    out = {}
    for level in levels:
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, optimizer = amp.initialize(model, optimizer, opt_level=level, **AMP_KWARGS)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for batch in batches():
            train_step(ddp, optimizer, *shard(batch, rank, world))
        out[level] = fp32_params(ddp)
        amp.deinitialize()
    # O2 masters are built per rank inside amp.initialize; apexlite's DDP and the DDP of apex's import
    # surface (what legacy scripts construct) broadcast rank 0's
    # and torch's DDP, after which the first backward rebuilds every master from the broadcast weights
    for label, wrapper in (("O2-rank-seeded", DistributedDataParallel), ("O2-rank-seeded-apex-ddp", ApexDDP),
                           ("O2-rank-seeded-torch-ddp", torch.nn.parallel.DistributedDataParallel)):
        model = tiny_model(seed=rank)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2", **AMP_KWARGS)
        ddp = wrapper(model)
        for batch in batches():
            train_step(ddp, optimizer, *shard(batch, rank, world))
        out[label] = fp32_params(ddp)
        out[f"{label}-masters"] = [p.detach().clone() for p in amp.master_params(optimizer)]
        amp.deinitialize()
    return out


def _overflow_step(ddp, optimizer, x, y, inject_rank: Optional[int], rank: int) -> dict:
    """One step; `inject_rank` puts an inf into its own grad after backward (a local-only overflow)."""
    before = fp32_params(ddp)
    loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
        if rank == inject_rank:
            next(ddp.parameters()).grad.view(-1)[0] = float("inf")
    optimizer.step()
    optimizer.zero_grad()
    after = fp32_params(ddp)
    return dict(stepped=any(not torch.equal(before[k], after[k]) for k in before),
                unchanged=all(torch.equal(before[k], after[k]) for k in before),
                scale=amp.state_dict()["loss_scaler0"]["loss_scale"])


def ddp_overflow(rank: int, world: int, level: str) -> Dict[str, dict]:
    """Local-only overflow with and without the flag all-reduce, and an overflowing loss on one rank."""
    out = {}
    for case in ("grad-inf-synced", "grad-inf-unsynced", "loss-inf-unsynced"):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level=level, verbosity=0)
        if case.endswith("unsynced"):
            sync_overflow(enabled=False)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        x, y = shard(batches(1)[0], rank, world)
        if case == "loss-inf-unsynced" and rank == 1:
            x = x.clone()
            x[0, 0] = float("inf")
        inject = 1 if case.startswith("grad-inf") else None
        out[case] = _overflow_step(ddp, optimizer, x, y, inject, rank)
        out[case]["next"] = _overflow_step(ddp, optimizer, x.nan_to_num(posinf=0.0), y, None, rank)
        amp.deinitialize()
    return out


def ddp_checkpoint(rank: int, world: int, path: str) -> dict:
    """O2 under apexlite DDP: an overflow (scale changes), checkpoint from rank 0, resume everywhere."""
    data = batches(6)

    def build():
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
        return DistributedDataParallel(model), optimizer

    ddp, optimizer = build()
    _overflow_step(ddp, optimizer, *shard(data[0], rank, world), inject_rank=1, rank=rank)
    for batch in data[1:3]:
        train_step(ddp, optimizer, *shard(batch, rank, world))
    if rank == 0:
        torch.save({"model": ddp.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "amp": amp.state_dict()}, path)
    for batch in data[3:]:
        train_step(ddp, optimizer, *shard(batch, rank, world))
    uninterrupted = fp32_params(ddp)
    scale_saved = amp.state_dict()["loss_scaler0"]["loss_scale"]
    amp.deinitialize()
    dist.barrier()

    ddp, optimizer = build()
    checkpoint = torch.load(path, map_location="cpu")
    ddp.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    amp.load_state_dict(checkpoint["amp"])
    loaded_scale = amp.state_dict()["loss_scaler0"]
    for batch in data[3:]:
        train_step(ddp, optimizer, *shard(batch, rank, world))
    resumed = fp32_params(ddp)
    amp.deinitialize()
    return dict(uninterrupted=uninterrupted, resumed=resumed, loaded_scale=loaded_scale, scale=scale_saved)


class _Warnings(logging.Handler):
    """The warnings apexlite's amp logs while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def ddp_no_sync_accumulation(rank: int, world: int, setups: List[Tuple[str, str]]) -> Dict[tuple, dict]:
    """Two micro-batches a step, the first under DDP's no_sync(), for each (opt level, optimizer): with
    scale_loss's defaults, and with delay_unscale=True on the first (apex's way, which keeps the grads scaled
    where DDP all-reduces them). Returns the params and amp's warnings of each run."""
    out = {}
    for level, kind in setups:
        for delay in (False, True):
            model = tiny_model()
            optimizer = FusedAdam(model.parameters(), lr=1e-2) if kind == "FusedAdam" else \
                torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            model, optimizer = amp.initialize(model, optimizer, opt_level=level, **AMP_KWARGS)
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            warnings = _Warnings()
            logging.getLogger("apexlite.amp").addHandler(warnings)
            try:
                for batch in batches():
                    x, y = shard(batch, rank, world)
                    half = len(x) // 2
                    for micro in range(2):
                        part = slice(micro * half, (micro + 1) * half)
                        with ddp.no_sync() if micro == 0 else contextlib.nullcontext():
                            loss = torch.nn.functional.mse_loss(ddp(x[part]).float(), y[part])
                            with amp.scale_loss(loss, optimizer, delay_unscale=delay and micro == 0) as scaled:
                                scaled.backward()
                    optimizer.step()
                    optimizer.zero_grad()
            finally:
                logging.getLogger("apexlite.amp").removeHandler(warnings)
            out[(level, kind, delay)] = dict(params=fp32_params(ddp), warnings=warnings.messages)
            amp.deinitialize()
    return out


def ddp_no_sync_overflow(rank: int, world: int, micro_batches: int) -> dict:
    """One O1 step of `micro_batches` micro-batches, all but the last under no_sync(); the first overflows on
    rank 0 alone. Returns the loss scale before and after, and whether the params stayed as they were."""
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", **AMP_KWARGS)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    before, scale = fp32_params(ddp), amp.state_dict()["loss_scaler0"]["loss_scale"]
    x, y = shard(batches(1)[0], rank, world)
    for micro in range(micro_batches):
        with ddp.no_sync() if micro < micro_batches - 1 else contextlib.nullcontext():
            loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
                if micro == 0 and rank == 0:
                    next(ddp.parameters()).grad.view(-1)[0] = float("inf")
    optimizer.step()
    after = fp32_params(ddp)
    result = dict(scale_before=scale, scale_after=amp.state_dict()["loss_scaler0"]["loss_scale"],
                  unchanged=all(torch.equal(before[k], after[k]) for k in before))
    amp.deinitialize()
    return result


def zero_redundancy(rank: int, world: int) -> dict:
    """torch's ZeroRedundancyOptimizer: O2 (its masters would be in no shard) is refused; O1 trains as a plain
    Adam does."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    out = {}
    for level, sharded in (("O2", True), ("O1", True), ("O1", False)):
        model = tiny_model()
        optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2) if sharded else \
            torch.optim.Adam(model.parameters(), lr=1e-2)
        try:
            model, optimizer = amp.initialize(model, optimizer, opt_level=level, **AMP_KWARGS)
        except Exception as error:  # noqa: BLE001 (the refusal is what this case returns)
            out[(level, sharded)] = f"{type(error).__name__}: {error}"
            continue
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for batch in batches():
            train_step(ddp, optimizer, *shard(batch, rank, world))
        out[(level, sharded)] = fp32_params(ddp)
        amp.deinitialize()
    return out
