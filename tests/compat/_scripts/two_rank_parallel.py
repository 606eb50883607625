"""Run by test_parallel_distributed.py in 2 gloo processes: apex.parallel pieces vs single-process references."""
import datetime
import gc
import os
import sys

import torch
import torch.distributed as dist

from apexlite.compat.apex import parallel
from apexlite.compat.apex.parallel import distributed
from apexlite.compat.apex.parallel.sync_batchnorm_kernel import SyncBatchnormFunction

dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()

# SyncBatchNorm on CPU: each rank's half of the batch is normalised with the global batch statistics.
gen = torch.Generator().manual_seed(0)
full = torch.randn(8, 3, 4, 4, generator=gen)
upstream = torch.randn(8, 3, 4, 4, generator=gen)
local = full[rank * 4:(rank + 1) * 4].clone().requires_grad_()
bn = parallel.SyncBatchNorm(3)
out = bn(local)
(out * upstream[rank * 4:(rank + 1) * 4]).sum().backward()
ref_in = full.clone().requires_grad_()
ref_bn = torch.nn.BatchNorm2d(3)
ref_out = ref_bn(ref_in)
(ref_out * upstream).sum().backward()
torch.testing.assert_close(out, ref_out[rank * 4:(rank + 1) * 4], rtol=1e-4, atol=1e-5)
torch.testing.assert_close(local.grad, ref_in.grad[rank * 4:(rank + 1) * 4], rtol=1e-4, atol=1e-5)
torch.testing.assert_close(bn.running_mean, ref_bn.running_mean)
torch.testing.assert_close(bn.running_var, ref_bn.running_var)
bn_params_synced = [p.grad.clone() for p in bn.parameters()]
for g in bn_params_synced:
    dist.all_reduce(g)
torch.testing.assert_close(bn_params_synced[0], ref_bn.weight.grad, rtol=1e-4, atol=1e-5)

# DDP: gradient_average=False sums over ranks; the default averages; disable_allreduce keeps local grads.
x = torch.full((2, 3), float(rank + 1))
for average, expected_scale in ((True, 1.5), (False, 3.0)):
    model = parallel.DistributedDataParallel(torch.nn.Linear(3, 1, bias=False), gradient_average=average)
    model(x).sum().backward()
    torch.testing.assert_close(model.module.weight.grad, torch.full((1, 3), 2.0 * expected_scale))
model.disable_allreduce()
model.module.weight.grad = None
model(x).sum().backward()
torch.testing.assert_close(model.module.weight.grad, torch.full((1, 3), 2.0 * (rank + 1)))

# Reducer: averages a list of tensors across ranks.
t = torch.full((3,), float(rank))
parallel.Reducer([t]).reduce()
torch.testing.assert_close(t, torch.full((3,), 0.5))
# flat_dist_call (BERT pretraining's gradient allreduce): one collective per dtype, averaged after all_reduce;
# broadcast with extra_args leaves rank 0's values everywhere.
grads = [torch.full((2, 3), float(rank + 1)), torch.full((4,), 10.0 * (rank + 1), dtype=torch.float64),
         torch.full((5,), -float(rank))]
distributed.flat_dist_call(grads, dist.all_reduce)
torch.testing.assert_close(grads[0], torch.full((2, 3), 1.5))
torch.testing.assert_close(grads[1], torch.full((4,), 15.0, dtype=torch.float64))
torch.testing.assert_close(grads[2], torch.full((5,), -0.5))
params = [torch.full((3,), float(rank)), torch.full((2, 2), float(rank) + 5)]
distributed.flat_dist_call(params, dist.broadcast, (0,))
torch.testing.assert_close(params[0], torch.zeros(3))
torch.testing.assert_close(params[1], torch.full((2, 2), 5.0))

# SyncBatchnormFunction: global statistics in, big-batch gradients out.
local = full[rank * 4:(rank + 1) * 4].clone().requires_grad_()
weight, bias = torch.randn(3, generator=gen).requires_grad_(), torch.randn(3, generator=gen).requires_grad_()
stats = torch.stack([local.detach().sum((0, 2, 3)), (local.detach() ** 2).sum((0, 2, 3))])
dist.all_reduce(stats)
count = full.numel() / 3
mean = stats[0] / count
var = stats[1] / count - mean * mean
out = SyncBatchnormFunction.apply(local, weight, bias, mean, var, 1e-5, None, world)
(out * upstream[rank * 4:(rank + 1) * 4]).sum().backward()
ref_in, ref_w, ref_b = full.clone().requires_grad_(), weight.detach().clone().requires_grad_(), \
    bias.detach().clone().requires_grad_()
ref_out = torch.nn.functional.batch_norm(ref_in, None, None, ref_w, ref_b, training=True, eps=1e-5)
(ref_out * upstream).sum().backward()
torch.testing.assert_close(out, ref_out[rank * 4:(rank + 1) * 4], rtol=1e-4, atol=1e-5)
torch.testing.assert_close(local.grad, ref_in.grad[rank * 4:(rank + 1) * 4], rtol=1e-4, atol=1e-5)
weight_grad = weight.grad.clone()
dist.all_reduce(weight_grad)
torch.testing.assert_close(weight_grad, ref_w.grad, rtol=1e-4, atol=1e-5)

# SyncBatchNorm: a large mean beside a small spread (E[x^2] - mean^2 lost the variance: errors of 1e-1 at 1000).
shifted = full + 1000.0
local = shifted[rank * 4:(rank + 1) * 4].clone()
torch.testing.assert_close(parallel.SyncBatchNorm(3)(local),
                           torch.nn.BatchNorm2d(3)(shifted)[rank * 4:(rank + 1) * 4], rtol=0, atol=3e-4)
# A one-rank group (per-rank statistics) on CPU: local batch norm (torch's SyncBatchNorm refused CPU input).
own = parallel.SyncBatchNorm(3, process_group=parallel.create_syncbn_process_group(1))
torch.testing.assert_close(own(local), torch.nn.BatchNorm2d(3)(local))

# apex's DDP broadcasts buffers at construction only: rank 0 may evaluate alone (a broadcast in each forward
# waited for the other rank); delay_allreduce trains a model with a param no forward uses.
with_buffers = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
with_buffers[1].running_mean.fill_(float(rank))
model = parallel.DistributedDataParallel(with_buffers)
torch.testing.assert_close(with_buffers[1].running_mean, torch.zeros(4))  # rank 0's, once, at construction
model(x).sum().backward()
if rank == 0:
    model.eval()
    with torch.no_grad():
        model(x)
dist.barrier()


class WithUnusedHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)

    def forward(self, inputs):
        return self.used(inputs)


for options in (dict(delay_allreduce=True), dict(find_unused_parameters=True)):
    model = parallel.DistributedDataParallel(WithUnusedHead(), **options)
    for _ in range(2):
        model(x).sum().backward()
    torch.testing.assert_close(model.module.used.weight.grad, torch.full((1, 3), 2 * 2 * 1.5))
print(f"rank {rank} ok")
# Same teardown as tests/parallel/_launch.py: no rank leaves while its peer may be in a collective,
# and interpreter teardown is skipped (gloo/DDP C++ threads destroyed at exit can abort a finished rank).
dist.barrier()
del model
gc.collect()
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
