"""A backward helper (`def backward(loss, optimizer)`) that scales a loss computed by its callers: the
forward passes and the losses go under torch.autocast where each call's argument is computed."""
import torch
from apex import amp


def backward(loss, optimizer):
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(4):
        optimizer.zero_grad()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        backward(loss, optimizer)
        extra = model(x).pow(2).mean()
        backward(extra, optimizer)
        optimizer.step()
        print(step, loss.item(), extra.item())
    return out


out = main()
