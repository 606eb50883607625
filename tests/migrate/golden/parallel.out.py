import os

import torch
import torch.distributed as dist
import apex.parallel

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.SyncBatchNorm(8, eps=1e-3), torch.nn.BatchNorm2d(8))
model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).cuda(local_rank)
# apexlite migrate: `message_size` dropped: it only tuned how apex's DDP overlapped communication
model = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
# TODO(apexlite migrate): `gradient_predivide_factor=4.0`: no
#     torch.nn.parallel.DistributedDataParallel equivalent (register a DDP comm hook that divides
#     before the all-reduce)
other = apex.parallel.DistributedDataParallel(torch.nn.Linear(2, 2).cuda(), gradient_predivide_factor=4.0)
