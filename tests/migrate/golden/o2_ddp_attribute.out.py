import torch
import torch.distributed as dist
from apexlite import amp
import apex.parallel

# O2 stays on apexlite: apex's DDP must not become torch's, which would leave each rank the fp32 masters
# amp.initialize built from that rank's own weights. Spelled through `apex.parallel`: a TODO says what to write.
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp stays on apexlite: O2's fp32 master weights have no torch.amp recipe;
#     --o2=bf16-autocast moves it to native bf16 autocast instead
model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale=128.0)
# TODO(apexlite migrate): amp may run O2 here and stays on amp's API: build this DDP with
#     apexlite.parallel.ddp_from_apex_args (apex's arguments), which broadcasts rank 0's fp32 master
#     weights with its weights; torch's DDP would leave each rank the masters of its own weights
model = apex.parallel.DistributedDataParallel(model, delay_allreduce=True)
for _ in range(3):
    loss = model(torch.randn(2, 4, dtype=torch.float16)).float().sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
