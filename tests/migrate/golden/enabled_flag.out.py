import argparse

import torch

torch.manual_seed(0)
parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true")
args = parser.parse_args()
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler), enabled when `args.amp` (its enabled=)
scaler = torch.amp.GradScaler("cpu", enabled=args.amp)
for _ in range(3):
    with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=args.amp):
        loss = model(torch.randn(2, 4)).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    with torch.autocast(device_type="cpu", enabled=False):
        print(model(torch.randn(1, 4)))
