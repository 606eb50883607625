"""The discriminator first: its block clips the generator's masters before the generator's scaled backward of
the pass, when the generator's grads are the last pass's, unscaled by its step: no unscale_ there."""
import torch
import torch.nn as nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
D = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer_G = torch.optim.SGD(G.parameters(), lr=1e-2)
optimizer_D = torch.optim.SGD(D.parameters(), lr=1e-2)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler_optimizer_G, scaler_optimizer_D)
scaler_optimizer_G = torch.amp.GradScaler("cpu")
scaler_optimizer_D = torch.amp.GradScaler("cpu")
mse = nn.MSELoss()
for it in range(6):
    real = torch.randn(4, 8)
    z = torch.randn(4, 8)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        fake = G(z)
        optimizer_D.zero_grad()
        loss_D = mse(D(real), torch.ones(4, 1)) + mse(D(fake.detach()), torch.zeros(4, 1))
    scaler_optimizer_D.scale(loss_D).backward()
    torch.nn.utils.clip_grad_norm_((p for group in optimizer_G.param_groups for p in group["params"]), 1.0)
    scaler_optimizer_D.step(optimizer_D)
    scaler_optimizer_D.update()

    optimizer_G.zero_grad()
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss_G = mse(D(fake), torch.ones(4, 1)) + mse(fake, real)
    scaler_optimizer_G.scale(loss_G).backward()
    scaler_optimizer_G.step(optimizer_G)
    scaler_optimizer_G.update()
    print(it, loss_G.item(), loss_D.item(), "G weight mean |w|", G[0].weight.float().abs().mean().item())
