"""Two O2 amp.initialize calls in the branches of an if (NVIDIA BERT): amp stays, so apex's DDP becomes ddp_from_apex_args, never torch's."""
import torch
from apex import amp
from apexlite.parallel import ddp_from_apex_args as DDP

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if True:
    # TODO(apexlite migrate): amp.initialize has 2 call sites; migrate rewrites scripts with one: make
    #     it one call (options chosen in the branches, say, then one amp.initialize after them) and run
    #     migrate again, keep apexlite's amp (`from apexlite import amp`), or migrate by hand
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale=0)
else:
    # TODO(apexlite migrate): amp.initialize has 2 call sites; migrate rewrites scripts with one: make
    #     it one call (options chosen in the branches, say, then one amp.initialize after them) and run
    #     migrate again, keep apexlite's amp (`from apexlite import amp`), or migrate by hand
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale="dynamic")
model = DDP(model)
loss = model(torch.randn(2, 4)).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
