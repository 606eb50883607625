"""Gradient accumulation that divides the loss in place (`loss /= steps`, FastPitch's train.py): the loss is
still traced to its forward pass, which goes under torch.autocast."""
import torch
from apex import amp

accumulation_steps = 2
model = torch.nn.Linear(4, 2)
criterion = torch.nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for step in range(4):
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    y_pred = model(x)
    loss = criterion(y_pred, y)
    loss /= accumulation_steps
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    if (step + 1) % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
