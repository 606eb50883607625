"""A reid-shaped script: amp behind a module-level flag, comments inside and around the apex block."""
import argparse

import torch
import torch.nn as nn
# mixed precision, when apex is installed
try:
    from apex import amp  # apex's amp
    # FusedSGD would go here
except ImportError:  # no apex: fp32
    # a comment inside the handler
    print("apex is not installed")

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
opt = parser.parse_args()
fp16 = opt.fp16


def train_model(model, criterion, optimizer, steps=3):
    for step in range(steps):
        inputs = torch.randn(4, 8)
        labels = torch.randint(0, 2, (4,))
        optimizer.zero_grad()
        # forward
        outputs = model(inputs)  # logits
        # the loss
        loss = criterion(outputs, labels)
        if fp16:  # we use the optimizer to backward the loss
            # scaled
            with amp.scale_loss(loss,  # the loss of this step
                                optimizer) as scaled_loss:  # apex scales it
                scaled_loss.backward()
            # after the scaled backward
        else:
            loss.backward()
        optimizer.step()  # one step
        # statistics
        print(step, loss.item())
    return model


model = nn.Linear(8, 2)
optimizer_ft = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()

if fp16:
    #model = network_to_half(model)
    #optimizer_ft = FP16_Optimizer(optimizer_ft, static_loss_scale = 128.0)
    model, optimizer_ft = amp.initialize(model, optimizer_ft,  # the model and its optimizer
                                         opt_level = "O1")  # O1

#if torch.cuda.get_device_capability()[0]>6:
#    torch.set_float32_matmul_precision('high')
    # https://example.com/a-note-indented-inside-the-if
#    model = torch.compile(model)
model = train_model(model, criterion, optimizer_ft,
                    steps=2)  # train
# the end
