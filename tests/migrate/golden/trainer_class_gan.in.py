"""A GAN training class: two models, two optimizers and two losses through one amp.initialize on attributes of self
(num_losses=2): each optimizer gets its own GradScaler attribute, named after it (self.scaler_opt_d)."""
import torch
from apex import amp


class GANTrainer:
    def __init__(self):
        torch.manual_seed(0)
        self.gen = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh())
        self.disc = torch.nn.Sequential(torch.nn.Linear(8, 1))
        self.opt_g = torch.optim.Adam(self.gen.parameters(), lr=1e-3)
        self.opt_d = torch.optim.Adam(self.disc.parameters(), lr=1e-3)
        [self.gen, self.disc], [self.opt_g, self.opt_d] = amp.initialize(
            [self.gen, self.disc], [self.opt_g, self.opt_d], opt_level="O1", num_losses=2)

    def step(self, real):
        fake = self.gen(torch.randn(real.shape[0], 4))
        loss_d = (self.disc(fake.detach()) - self.disc(real)).mean()
        self.opt_d.zero_grad()
        with amp.scale_loss(loss_d, self.opt_d, loss_id=0) as scaled:
            scaled.backward()
        self.opt_d.step()
        loss_g = -self.disc(fake).mean()
        self.opt_g.zero_grad()
        with amp.scale_loss(loss_g, self.opt_g, loss_id=1) as scaled:
            scaled.backward()
        self.opt_g.step()
        return fake, loss_d, loss_g


trainer = GANTrainer()
for _ in range(4):
    fake, loss_d, loss_g = trainer.step(torch.randn(8, 8))
