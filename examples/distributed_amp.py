"""Distributed apex.amp + apex.parallel.DistributedDataParallel (legacy API, unchanged), gloo on CPU.

Like apex's examples/simple/distributed: each process reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
from the environment (torchrun sets them):
    torchrun --nproc-per-node=2 -m apexlite run examples/distributed_amp.py --steps 20
At the end every rank checks that all ranks hold identical weights (DDP kept them in sync).
"""
import argparse
import datetime
import os

import torch
import torch.distributed as dist

from apex import amp
from apex.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", default=int(os.environ.get("LOCAL_RANK", 0)), type=int)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--opt-level", default="O1")
args = parser.parse_args()

dist.init_process_group(backend="gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)  # different initial weights per rank: DDP must broadcast rank 0's

N, D_in, D_out = 64, 256, 16
x = torch.randn(N, D_in)
y = torch.randn(N, D_out)
model = torch.nn.Linear(D_in, D_out)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
model = DistributedDataParallel(model)
loss_fn = torch.nn.MSELoss()

for t in range(args.steps):
    optimizer.zero_grad()
    loss = loss_fn(model(x).float(), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    if rank == 0:
        print("step {} loss {:.4f} loss_scale {}".format(t, loss.item(), amp._amp_state.loss_scalers[0].loss_scale()))

flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
gathered = [torch.empty_like(flat) for _ in range(world)]
# The last collectives keep their handles until exit, so a gloo worker thread never holds the last reference
# to a tensor Python knows: letting it go during interpreter shutdown would abort this finished process
# (a torch gloo race; docs/distributed.md, "The end of a gloo run").
gather = dist.all_gather(gathered, flat, async_op=True)
gather.wait()
assert all(torch.equal(gathered[0], g) for g in gathered), "ranks diverged"
print("rank {}: weights identical on all {} ranks".format(rank, world))
barrier = dist.barrier(async_op=True)  # no rank tears gloo down while a peer is still in a collective
barrier.wait()
del model, optimizer  # release DDP's reducer before its process group goes away
dist.destroy_process_group()
