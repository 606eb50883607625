"""Registrations of ops that torch.autocast on CUDA already runs in that precision (Transformer-XL's einsum, a
float32 softplus) are dropped with a note; the rest of the O1 script migrates as usual."""
import sys

import torch
import torch.nn.functional as F

    # apexlite migrate: `amp.register_half_function(torch, "einsum")` removed: torch.autocast on CUDA
    #     already runs torch.einsum in its lower precision (float16, or bfloat16 where the script asks
    #     for it)
# apexlite migrate: `amp.register_float_function(F, "softplus")` removed: torch.autocast on CUDA
#     already runs torch.nn.functional.softplus in float32


def train(steps):
    model = torch.nn.Linear(16, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
    #     pass and the loss and torch.amp.GradScaler (scaler)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(steps):
        x = torch.randn(8, 16).cuda()
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            out = torch.einsum("bi,bi->bi", model(x), model(x))
            loss = F.softplus(out).mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
