"""A typical apex O1 script on CUDA: the forward and loss go under autocast, scale_loss becomes a GradScaler."""
import torch
import torch.nn as nn
from apex import amp


def train(epochs):
    model = nn.Linear(16, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")  # O1: patch torch functions
    for epoch in range(epochs):
        for x, y in batches():
            x, y = x.cuda(non_blocking=True), y.cuda()
            optimizer.zero_grad()
            # forward
            output = model(x)
            loss = nn.functional.cross_entropy(output, y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:  # the scaled backward
                scaled_loss.backward()
            optimizer.step()
        print("epoch", epoch, "loss", loss.item(), "scale", amp._amp_state.loss_scalers[0].loss_scale())
