"""A GAN training class: two models, two optimizers and two losses through one amp.initialize on attributes of self
(num_losses=2): each optimizer gets its own GradScaler attribute, named after it (self.scaler_opt_d)."""
import torch


class GANTrainer:
    def __init__(self):
        torch.manual_seed(0)
        self.gen = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh())
        self.disc = torch.nn.Sequential(torch.nn.Linear(8, 1))
        self.opt_g = torch.optim.Adam(self.gen.parameters(), lr=1e-3)
        self.opt_d = torch.optim.Adam(self.disc.parameters(), lr=1e-3)
        # apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
        #     pass and the loss and torch.amp.GradScaler (self.scaler_opt_d, self.scaler_opt_g)
        self.scaler_opt_d = torch.amp.GradScaler("cpu")
        self.scaler_opt_g = torch.amp.GradScaler("cpu")

    def step(self, real):
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            fake = self.gen(torch.randn(real.shape[0], 4))
            loss_d = (self.disc(fake.detach()) - self.disc(real)).mean()
        self.opt_d.zero_grad()
        self.scaler_opt_d.scale(loss_d).backward()
        self.scaler_opt_d.step(self.opt_d)
        self.scaler_opt_d.update()
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            loss_g = -self.disc(fake).mean()
        self.opt_g.zero_grad()
        self.scaler_opt_g.scale(loss_g).backward()
        self.scaler_opt_g.step(self.opt_g)
        self.scaler_opt_g.update()
        return fake, loss_d, loss_g


trainer = GANTrainer()
for _ in range(4):
    fake, loss_d, loss_g = trainer.step(torch.randn(8, 8))
