"""Two optimizers, three losses: loss ids 0 and 1 meet in optimizer_a's gradients."""
import torch

torch.manual_seed(0)
net_a, net_b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
optimizer_a = torch.optim.SGD(net_a.parameters(), lr=0.1)
optimizer_b = torch.optim.SGD(net_b.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler_optimizer_a, scaler_optimizer_b)
scaler_optimizer_a = torch.amp.GradScaler("cpu")
scaler_optimizer_b = torch.amp.GradScaler("cpu")
for _ in range(3):
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        features = net_a(torch.randn(2, 4))
        first = features.pow(2).mean()
    scaler_optimizer_a.scale(first).backward(retain_graph=True)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        second = features.abs().mean()
    scaler_optimizer_a.scale(second).backward()
    scaler_optimizer_a.step(optimizer_a)
    scaler_optimizer_a.update()
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        third = net_b(torch.randn(2, 4)).mean()
    scaler_optimizer_b.scale(third).backward()
    scaler_optimizer_b.step(optimizer_b)
    scaler_optimizer_b.update()
    print([s.get_scale() for s in (scaler_optimizer_a, scaler_optimizer_a, scaler_optimizer_b)])
