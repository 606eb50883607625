"""A gradient norm logged after the clip: the clip gets scaler.unscale_ before it, so what follows reads unscaled
gradients, as under apex, and no TODO is needed; dividing the grads by a constant is the same either way."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")
for step in range(4):
    optimizer.zero_grad()
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = ((model(x).float() - y) ** 2).mean()
    scaler.scale(loss).backward()
    for p in model.parameters():
        p.grad.div_(2.0)
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    grad_norm = sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5
    scaler.step(optimizer)
    scaler.update()
print(f"{float(grad_norm) < 1000}")
