import torch
from apex import amp

# The generator runs before the critic's first backward, which does not use its output; the critic's
# second loss and the generator's own loss do: that forward must run under autocast too (apex's O1
# cast it), though an earlier backward lies between it and those losses.
torch.manual_seed(0)
generator = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
critic = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1))
opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
[generator, critic], [opt_g, opt_c] = amp.initialize([generator, critic], [opt_g, opt_c], opt_level="O1",
                                                     num_losses=3)
criterion = torch.nn.BCEWithLogitsLoss()
real = torch.randn(16, 8)
for step in range(4):
    opt_c.zero_grad()
    noise = torch.randn(16, 8)
    fake = generator(noise)
    loss_real = criterion(critic(real), torch.ones(16, 1))
    with amp.scale_loss(loss_real, opt_c, loss_id=0) as scaled:
        scaled.backward()
    loss_fake = criterion(critic(fake.detach()), torch.zeros(16, 1))
    with amp.scale_loss(loss_fake, opt_c, loss_id=1) as scaled:
        scaled.backward()
    opt_c.step()
    opt_g.zero_grad()
    loss_g = criterion(critic(fake), torch.ones(16, 1))
    with amp.scale_loss(loss_g, opt_g, loss_id=2) as scaled:
        scaled.backward()
    opt_g.step()
    print(step, float(loss_real + loss_fake), float(loss_g), fake.dtype)
