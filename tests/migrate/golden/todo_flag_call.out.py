"""amp under a test that calls something: migrate cannot evaluate it again for autocast and GradScaler."""
import torch
from apex import amp

model = torch.nn.Linear(2, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if torch.cuda.is_available():
    # TODO(apexlite migrate): amp.initialize runs only when `torch.cuda.is_available()`, which migrate
    #     cannot evaluate again for the GradScaler and torch.autocast (it calls or computes something):
    #     assign it to a variable before the `if`, test that, and run migrate again
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
loss = model(torch.randn(2, 2).cuda()).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
