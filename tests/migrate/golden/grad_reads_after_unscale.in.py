"""A gradient norm logged after the clip: the clip gets scaler.unscale_ before it, so what follows reads unscaled
gradients, as under apex, and no TODO is needed; dividing the grads by a constant is the same either way."""
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
        p.grad.div_(2.0)
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    grad_norm = sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5
    optimizer.step()
print(f"{float(grad_norm) < 1000}")
