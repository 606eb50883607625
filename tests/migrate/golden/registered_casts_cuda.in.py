"""Registrations of ops that torch.autocast on CUDA already runs in that precision (Transformer-XL's einsum, a
float32 softplus) are dropped with a note; the rest of the O1 script migrates as usual."""
import sys

import torch
import torch.nn.functional as F
from apex import amp

if "apex" in sys.modules:
    amp.register_half_function(torch, "einsum")
amp.register_float_function(F, "softplus")


def train(steps):
    model = torch.nn.Linear(16, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for _ in range(steps):
        x = torch.randn(8, 16).cuda()
        out = torch.einsum("bi,bi->bi", model(x), model(x))
        loss = F.softplus(out).mean()
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
