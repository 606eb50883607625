"""A GAN loop (CycleGAN's shape) whose discriminator block also clips the generator's masters after the generator
stepped: its grads are unscaled already, so that clip gets no unscale_ (a second one in the step would raise)."""
import torch
import torch.nn as nn
from apex import amp

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
D = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer_G = torch.optim.Adam(G.parameters(), lr=1e-3)
optimizer_D = torch.optim.Adam(D.parameters(), lr=1e-3)
[G, D], [optimizer_G, optimizer_D] = amp.initialize([G, D], [optimizer_G, optimizer_D], opt_level="O1", num_losses=2)
mse = nn.MSELoss()
for it in range(8):
    real = torch.randn(4, 8)
    z = torch.randn(4, 8)
    optimizer_G.zero_grad()
    fake = G(z)
    loss_G = mse(D(fake), torch.ones(4, 1)) + mse(fake, real)
    with amp.scale_loss(loss_G, optimizer_G, loss_id=0) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer_G), 1.0)
    optimizer_G.step()

    optimizer_D.zero_grad()
    loss_D = mse(D(real), torch.ones(4, 1)) + mse(D(fake.detach()), torch.zeros(4, 1))
    with amp.scale_loss(loss_D, optimizer_D, loss_id=1) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer_G), 1.0)
    optimizer_D.step()
    print(it, loss_G.item(), loss_D.item(), G[0].weight.float().abs().mean().item())
