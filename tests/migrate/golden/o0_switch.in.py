"""Mask R-CNN's trainer: amp's opt level is O1 when the config asks for float16, else O0 (plain fp32)."""
import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--dtype", default="float32")
args = parser.parse_args()

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
use_mixed_precision = args.dtype == "float16"
amp_opt_level = "O1" if use_mixed_precision else "O0"
model, optimizer = amp.initialize(model, optimizer, opt_level=amp_opt_level)
for step in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
print(float(loss))
