"""HF distillation (DeeBERT fork) imports DistributedDataParallel from apex in one branch and from torch in the other:
only the apex branch's call is apex's (it becomes torch's), and its import goes; the torch branch is left as it is."""
import torch
import torch.nn as nn


def wrap(model, fp16, local_rank):
    if fp16:
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank,
                                        find_unused_parameters=True)
    return model


model = nn.Linear(8, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")
for i in range(3):
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
