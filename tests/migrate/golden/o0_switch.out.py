"""Mask R-CNN's trainer: amp's opt level is O1 when the config asks for float16, else O0 (plain fp32)."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--dtype", default="float32")
args = parser.parse_args()

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
use_mixed_precision = args.dtype == "float16"
amp_opt_level = "O1" if use_mixed_precision else "O0"
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler), enabled when `bool(use_mixed_precision)`
#     (its opt_level is O1 then, O0 otherwise)
scaler = torch.amp.GradScaler("cpu", enabled=bool(use_mixed_precision))
for step in range(3):
    with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=bool(use_mixed_precision)):
        loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print(float(loss))
