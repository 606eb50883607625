"""A GAN loop (CycleGAN's shape) whose discriminator block also clips the generator's masters after the generator
stepped: its grads are unscaled already, so that clip gets no unscale_ (a second one in the step would raise)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
D = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer_G = torch.optim.Adam(G.parameters(), lr=1e-3)
optimizer_D = torch.optim.Adam(D.parameters(), lr=1e-3)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler_optimizer_G, scaler_optimizer_D)
scaler_optimizer_G = torch.amp.GradScaler("cpu")
scaler_optimizer_D = torch.amp.GradScaler("cpu")
mse = nn.MSELoss()
for it in range(8):
    real = torch.randn(4, 8)
    z = torch.randn(4, 8)
    optimizer_G.zero_grad()
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        fake = G(z)
        loss_G = mse(D(fake), torch.ones(4, 1)) + mse(fake, real)
    scaler_optimizer_G.scale(loss_G).backward()
    scaler_optimizer_G.unscale_(optimizer_G)
    torch.nn.utils.clip_grad_norm_((p for group in optimizer_G.param_groups for p in group["params"]), 1.0)
    scaler_optimizer_G.step(optimizer_G)
    scaler_optimizer_G.update()

    optimizer_D.zero_grad()
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss_D = mse(D(real), torch.ones(4, 1)) + mse(D(fake.detach()), torch.zeros(4, 1))
    scaler_optimizer_D.scale(loss_D).backward()
    torch.nn.utils.clip_grad_norm_((p for group in optimizer_G.param_groups for p in group["params"]), 1.0)
    scaler_optimizer_D.step(optimizer_D)
    scaler_optimizer_D.update()
    print(it, loss_G.item(), loss_D.item(), G[0].weight.float().abs().mean().item())
