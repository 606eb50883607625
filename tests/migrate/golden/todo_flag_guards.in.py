"""Flags migrate cannot repeat exactly: each amp part stays, with a TODO saying what to change."""
import torch
from apex import amp


def rebinds_the_flag(fp16):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    fp16 = fp16 and model.weight.is_cuda
    loss = model(torch.randn(2, 2)).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
