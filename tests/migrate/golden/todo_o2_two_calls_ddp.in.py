"""Two O2 amp.initialize calls in the branches of an if (NVIDIA BERT): amp stays, so apex's DDP becomes ddp_from_apex_args, never torch's."""
import torch
from apex import amp
from apex.parallel import DistributedDataParallel as DDP

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if True:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale=0)
else:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale="dynamic")
model = DDP(model)
loss = model(torch.randn(2, 4)).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
