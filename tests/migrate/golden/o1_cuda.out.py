"""A typical apex O1 script on CUDA: the forward and loss go under autocast, scale_loss becomes a GradScaler."""
import torch
import torch.nn as nn


def train(epochs):
    model = nn.Linear(16, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # O1: patch torch functions
    # apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
    #     pass and the loss and torch.amp.GradScaler (scaler)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(epochs):
        for x, y in batches():
            x, y = x.cuda(non_blocking=True), y.cuda()
            optimizer.zero_grad()
            # forward
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                output = model(x)
                loss = nn.functional.cross_entropy(output, y)
            # the scaled backward
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        print("epoch", epoch, "loss", loss.item(), "scale", scaler.get_scale())
