"""Rank code for gradient-communication dtypes and FSDP2 loss scaling (see _workers.py for the setup)."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from apexlite import amp
from apexlite.amp.errors import AmpConfigError, AmpUsageError
from apexlite.amp.session import current_session
from apexlite.parallel import (
    DistributedDataParallel, ddp_from_apex_args, fully_shard, initialize_fsdp, sync_overflow,
)
from tests.parallel._workers import AMP_KWARGS, batches, shard, tiny_model, train_step

COMM_STEPS = 25


def teacher_batches() -> List[tuple]:
    """Two batches whose targets a linear teacher produced, so the loss can fall well."""
    teacher = torch.randn(4, 2, generator=torch.Generator().manual_seed(5))
    return [(x, x @ teacher) for x, _ in batches(2, seed=7)]


def _train_losses(ddp, optimizer, rank: int, world: int) -> List[float]:
    data = teacher_batches()
    return [train_step(ddp, optimizer, *shard(data[i % 2], rank, world)) for i in range(COMM_STEPS)]


def comm_dtypes(rank: int, world: int) -> dict:
    """Train the same model with fp32, bf16 and fp16 gradient communication; probe pre-division."""
    out: Dict[str, dict] = {}
    for name, level, dtype in (("O0-fp32", "O0", None), ("O0-bf16", "O0", torch.bfloat16),
                               ("O0-fp16", "O0", torch.float16), ("O2-fp16", "O2", None),
                               ("O2-bf16", "O2", torch.bfloat16)):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level=level, **AMP_KWARGS)
        ddp = DistributedDataParallel(model, reduce_dtype=dtype)
        losses = _train_losses(ddp, optimizer, rank, world)
        out[name] = dict(losses=losses, params=[p.detach().float().clone() for p in ddp.parameters()])
        amp.deinitialize()
    out.update(_fused_adam_runs(rank, world))
    out["predivide"] = _predivide_probe(rank)
    out["apex-args"] = _apex_args_probe(rank, world)
    out["sums"] = _sum_probe()
    return out


def _fused_adam_runs(rank: int, world: int) -> Dict[str, dict]:
    """O2 grads reduced in fp16 and fed as they are to FusedAdam's fused fp32-master update,
    against O2's own fp32 master grads with torch AdamW."""
    from apexlite.optimizers import FusedAdam

    out = {}
    for name in ("O2-adamw", "O2-fusedadam"):
        model = tiny_model()
        if name == "O2-adamw":
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            model, optimizer = amp.initialize(model, optimizer, opt_level="O2", **AMP_KWARGS)
        else:
            # plain O2: amp keeps the fp32 masters inside FusedAdam and its kernel unscales the half grads
            optimizer = FusedAdam(model.parameters(), lr=1e-2)
            model, optimizer = amp.initialize(model, optimizer, opt_level="O2", **AMP_KWARGS)
        ddp = DistributedDataParallel(model)
        data = teacher_batches()
        grad_dtypes = set()
        for i in range(COMM_STEPS):
            x, y = shard(data[i % 2], rank, world)
            loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            grad_dtypes |= {str(p.grad.dtype) for group in optimizer.param_groups for p in group["params"]}
            grad_dtypes |= {str(s["master_param"].grad.dtype) for s in optimizer.state.values()
                            if "master_param" in s and s["master_param"].grad is not None}
            optimizer.step()
            optimizer.zero_grad()
        out[name] = dict(params=[p.detach().float().clone() for p in ddp.parameters()], grad_dtypes=grad_dtypes,
                         loss=loss.item())
        amp.deinitialize()
    return out


class _Scale(torch.nn.Module):
    """y = w * x with one weight: backward of y.sum() makes the local grad equal x.sum()."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x


def _predivide_probe(rank: int) -> Dict[str, torch.Tensor]:
    """40000 per rank: summed before dividing, 80000 overflows fp16; pre-divided it stays finite."""
    out = {}
    for name, dtype, wire, factor in (("fp16-pre", torch.float16, torch.float16, None),
                                      ("fp16-post", torch.float16, torch.float16, 1.0),
                                      ("fp32-to-fp16-wire", torch.float32, torch.float16, None),
                                      ("fp16-to-fp32-wire-post", torch.float16, torch.float32, 1.0)):
        ddp = DistributedDataParallel(_Scale(dtype), reduce_dtype=wire, gradient_predivide_factor=factor)
        ddp(torch.full((1,), 40000.0, dtype=dtype)).float().sum().backward()
        out[name] = ddp.module.weight.grad.detach().float().clone()
    ddp = ddp_from_apex_args(_Scale(torch.float16), allreduce_always_fp32=True)  # apex's default factor 1.0
    ddp(torch.full((1,), 40000.0, dtype=torch.float16)).float().sum().backward()
    out["apex-allreduce-always-fp32"] = ddp.module.weight.grad.detach().float().clone()
    return out


def _sum_probe() -> Dict[str, float]:
    """gradient_average=False with and without a predivide factor, each rank's grad 1.0 (apex divided a sum
    by the factor too)."""
    out = {}
    for name, kwargs in (("sum", {}), ("sum-predivided-4", dict(gradient_predivide_factor=4.0))):
        for make in (ddp_from_apex_args, DistributedDataParallel):
            ddp = make(_Scale(torch.float32), gradient_average=False, **kwargs)
            ddp(torch.ones(1)).sum().backward()
            out[f"{name} {make.__name__}"] = ddp.module.weight.grad.item()
    return out


def _apex_args_probe(rank: int, world: int) -> dict:
    """Legacy arguments mapped: one bucket for delay_allreduce, fp32 wire, post-division by default."""
    model = tiny_model()
    ddp = ddp_from_apex_args(model, delay_allreduce=True, allreduce_always_fp32=True)
    x, y = shard(batches(1)[0], rank, world)
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    with_spare = ddp_from_apex_args(_WithSpare(), delay_allreduce=True)  # apex reduced whatever grads were made
    for _ in range(2):  # torch's DDP refuses the second backward when a param went unused and it was not told
        torch.nn.functional.mse_loss(with_spare(x), y).backward()
    return dict(reduce_dtype=ddp.reduce_config.reduce_dtype, factors=ddp.reduce_config.factors(),
                grads=[p.grad.clone() for p in ddp.parameters()], spare_grad=with_spare.module.spare.weight.grad)


class _WithSpare(torch.nn.Module):
    """tiny_model beside a layer its forward never uses (a head only some configurations train)."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.spare = tiny_model(), torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _local(model: torch.nn.Module) -> List[torch.Tensor]:
    return [p.to_local().detach().clone() for p in model.parameters()]


def _fsdp_step(model, optimizer, x, y, inject_rank: Optional[int], rank: int) -> dict:
    before = _local(model)
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
        if rank == inject_rank:
            with torch.no_grad():
                next(model.parameters()).grad.to_local().view(-1)[0] = float("inf")
    optimizer.step()
    optimizer.zero_grad()
    after = _local(model)
    return dict(unchanged=all(torch.equal(a, b) for a, b in zip(before, after)),
                scale=amp.state_dict()["loss_scaler0"]["loss_scale"])


def fsdp_loss_scaling(rank: int, world: int) -> dict:
    """FSDP2 + fp16 MixedPrecisionPolicy + apexlite O0 dynamic scaling; O1; refusals of O2/O3."""
    from apexlite.parallel.fsdp import fsdp2

    MixedPrecisionPolicy = fsdp2().MixedPrecisionPolicy

    out: dict = {}
    data = batches()
    for level, policy in (("O0", MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)),
                          ("O1", MixedPrecisionPolicy())):
        model = fully_shard(tiny_model(), mp_policy=policy)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, optimizer = initialize_fsdp(model, optimizer, opt_level=level, **AMP_KWARGS)
        for batch in data:
            train_step(model, optimizer, *shard(batch, rank, world))
        out[level] = [p.full_tensor().detach().clone() for p in model.parameters()]
        if level == "O0":
            x, y = shard(data[0], rank, world)
            out["synced"] = _fsdp_step(model, optimizer, x, y, inject_rank=1, rank=rank)
            sync_overflow(enabled=False)
            out["unsynced"] = _fsdp_step(model, optimizer, x, y, inject_rank=1, rank=rank)
        amp.deinitialize()
    out["refused"] = {}
    for level in ("O2", "O3"):
        model = fully_shard(tiny_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        try:
            initialize_fsdp(model, optimizer, opt_level=level)
        except AmpConfigError as error:
            out["refused"][level] = str(error)
        try:  # amp.initialize straight on the sharded model is refused as well
            amp.initialize(model, optimizer, opt_level=level, verbosity=0)
        except AmpConfigError as error:
            out["refused"][f"amp.initialize {level}"] = str(error)
        assert current_session(required=False) is None and all(p.dtype is torch.float32 for p in model.parameters())
    from torch.distributed.fsdp import FullyShardedDataParallel

    legacy = FullyShardedDataParallel(tiny_model(), device_id=torch.device("cpu"))
    try:
        amp.initialize(legacy, torch.optim.SGD(legacy.parameters(), lr=0.1), opt_level="O1", verbosity=0)
    except AmpUsageError as error:
        out["refused"]["FSDP1"] = str(error)
    try:
        fully_shard(tiny_model().half())
    except AmpConfigError as error:
        out["refused"]["half-model"] = str(error)
    return out
