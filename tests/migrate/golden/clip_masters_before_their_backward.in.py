"""The discriminator first: its block clips the generator's masters before the generator's scaled backward of
the pass, when the generator's grads are the last pass's, unscaled by its step: no unscale_ there."""
import torch
import torch.nn as nn
from apex import amp

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
D = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer_G = torch.optim.SGD(G.parameters(), lr=1e-2)
optimizer_D = torch.optim.SGD(D.parameters(), lr=1e-2)
[G, D], [optimizer_G, optimizer_D] = amp.initialize([G, D], [optimizer_G, optimizer_D], opt_level="O1", num_losses=2)
mse = nn.MSELoss()
for it in range(6):
    real = torch.randn(4, 8)
    z = torch.randn(4, 8)
    fake = G(z)
    optimizer_D.zero_grad()
    loss_D = mse(D(real), torch.ones(4, 1)) + mse(D(fake.detach()), torch.zeros(4, 1))
    with amp.scale_loss(loss_D, optimizer_D, loss_id=1) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer_G), 1.0)
    optimizer_D.step()

    optimizer_G.zero_grad()
    loss_G = mse(D(fake), torch.ones(4, 1)) + mse(fake, real)
    with amp.scale_loss(loss_G, optimizer_G, loss_id=0) as scaled_loss:
        scaled_loss.backward()
    optimizer_G.step()
    print(it, loss_G.item(), loss_D.item(), "G weight mean |w|", G[0].weight.float().abs().mean().item())
