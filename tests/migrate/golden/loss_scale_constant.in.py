"""A loss scale of 1.0 needs no GradScaler: the printed scale becomes the constant, written into the
f-string's text."""
import torch
from apex import amp

model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1", loss_scale=1.0)
loss = model(torch.randn(2, 2)).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
print(f"loss {loss.item():.3f} scale {amp._amp_state.loss_scalers[0].loss_scale()}")
