import os

import torch
import torch.distributed as dist
from apex.parallel import DistributedDataParallel as DDP, SyncBatchNorm, convert_syncbn_model
import apex.parallel

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), SyncBatchNorm(8, eps=1e-3), torch.nn.BatchNorm2d(8))
model = convert_syncbn_model(model).cuda(local_rank)
model = DDP(model, delay_allreduce=True, message_size=2**20)
other = apex.parallel.DistributedDataParallel(torch.nn.Linear(2, 2).cuda(), gradient_predivide_factor=4.0)
