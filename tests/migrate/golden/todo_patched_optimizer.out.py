import torch
from apex import amp

model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
original_step = optimizer.step
# TODO(apexlite migrate): `optimizer.step` is replaced here; torch.amp.GradScaler.step calls the
#     optimizer's step itself and skips it on inf/NaN gradients: check the replacement still works
#     under it
optimizer.step = lambda closure=None: original_step(closure)
loss = model(torch.randn(2, 4)).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
