"""DCGAN-style apex.amp script (legacy API, unchanged): two models, two optimizers, three losses.

As in apex's examples/dcgan/main_amp.py: `amp.initialize([netD, netG], [optimizerD, optimizerG],
num_losses=3)`, then `scale_loss(..., loss_id=0)` for D on real images, `loss_id=1` for D on fakes
(accumulated into the same optimizerD step) and `loss_id=2` for G. The data is synthetic.
    python -m apexlite run examples/dcgan_amp.py --opt_level O1 --niter 1
"""
import argparse

import torch
import torch.nn as nn

from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--batchSize", type=int, default=16)
parser.add_argument("--imageSize", type=int, default=16)
parser.add_argument("--nz", type=int, default=16)
parser.add_argument("--ngf", type=int, default=8)
parser.add_argument("--ndf", type=int, default=8)
parser.add_argument("--niter", type=int, default=1)
parser.add_argument("--iters-per-epoch", type=int, default=10)
parser.add_argument("--lr", type=float, default=0.0002)
parser.add_argument("--beta1", type=float, default=0.5)
parser.add_argument("--manualSeed", type=int, default=1)
parser.add_argument("--opt_level", default="O1")
opt = parser.parse_args()
torch.manual_seed(opt.manualSeed)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(opt.nz, opt.ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(opt.ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(opt.ngf * 2, opt.ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(opt.ngf), nn.ReLU(True),
            nn.ConvTranspose2d(opt.ngf, 3, 4, 2, 1, bias=False), nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(3, opt.ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(opt.ndf, opt.ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(opt.ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(opt.ndf * 2, 1, 4, 1, 0, bias=False),
        )

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)  # logits: BCEWithLogitsLoss is amp-safe, BCELoss is not


def real_images(batch_size):
    """'Real' data: smooth colour gradients, easy for D to tell from G's early noise."""
    ramp = torch.linspace(-1, 1, opt.imageSize)
    base = (ramp.view(1, 1, -1, 1) * ramp.view(1, 1, 1, -1)).expand(batch_size, 3, -1, -1)
    return base * torch.rand(batch_size, 3, 1, 1) * 0.8


netG, netD = Generator(), Discriminator()
criterion = nn.BCEWithLogitsLoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
[netD, netG], [optimizerD, optimizerG] = amp.initialize(
    [netD, netG], [optimizerD, optimizerG], opt_level=opt.opt_level, num_losses=3)

real_label, fake_label = 1.0, 0.0
for epoch in range(opt.niter):
    for i in range(opt.iters_per_epoch):
        # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real = real_images(opt.batchSize)
        label = torch.full((opt.batchSize,), real_label, dtype=torch.float)
        errD_real = criterion(netD(real), label)
        with amp.scale_loss(errD_real, optimizerD, loss_id=0) as errD_real_scaled:
            errD_real_scaled.backward()
        noise = torch.randn(opt.batchSize, opt.nz, 1, 1)
        fake = netG(noise)
        label.fill_(fake_label)
        errD_fake = criterion(netD(fake.detach()), label)
        with amp.scale_loss(errD_fake, optimizerD, loss_id=1) as errD_fake_scaled:
            errD_fake_scaled.backward()
        errD = errD_real + errD_fake
        optimizerD.step()
        # (2) Update G: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        errG = criterion(netD(fake), label)
        with amp.scale_loss(errG, optimizerG, loss_id=2) as errG_scaled:
            errG_scaled.backward()
        optimizerG.step()
        scales = [s.loss_scale() for s in amp._amp_state.loss_scalers]
        print("[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f loss_scales: %s"
              % (epoch, opt.niter, i, opt.iters_per_epoch, errD.item(), errG.item(), scales))
