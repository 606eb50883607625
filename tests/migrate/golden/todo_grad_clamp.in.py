"""Gradients clamped by hand after the scaled backward (the DQN tutorial's idiom): apex had unscaled them when
scale_loss exited, torch.amp's GradScaler has not yet, so the clamp would cut scaled grads; a TODO. The zero_grad,
the None test and the clip (which gets its unscale_) are fine as they are."""
import torch
import torch.nn as nn
from apex import amp

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for step in range(4):
    optimizer.zero_grad()
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    loss = ((model(x).float() - y) ** 2).mean()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.data.clamp_(-0.1, 0.1)
    optimizer.step()
