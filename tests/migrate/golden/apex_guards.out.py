"""The ways scripts guard apex imports: a HAS_APEX flag, a try that only re-raises with an install hint,
and the always-true `multi_tensor_applier.available`. Once apex is gone nothing in them can fail."""
import argparse

import torch

HAS_APEX = True

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
args = parser.parse_args()
print("multi_tensor_applier.available = {}".format(True))
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) ran only when `HAS_APEX and args.fp16`: it became
#     torch.autocast(float16) around the forward pass and the loss and torch.amp.GradScaler
#     (scaler), on every path, enabled by that flag
scaler = torch.amp.GradScaler("cpu", enabled=HAS_APEX and args.fp16)
for _ in range(3):
    with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=HAS_APEX and args.fp16):
        loss = model(torch.randn(2, 2)).sum()
    if HAS_APEX and args.fp16:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    scaler.step(optimizer)
    scaler.update()
    print("loss", loss.item())
