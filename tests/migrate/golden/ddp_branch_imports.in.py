"""HF distillation (DeeBERT fork) imports DistributedDataParallel from apex in one branch and from torch in the other:
only the apex branch's call is apex's (it becomes torch's), and its import goes; the torch branch is left as it is."""
import torch
import torch.nn as nn
from apex import amp


def wrap(model, fp16, local_rank):
    if fp16:
        from apex.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    else:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank,
                                        find_unused_parameters=True)
    return model


model = nn.Linear(8, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for i in range(3):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
