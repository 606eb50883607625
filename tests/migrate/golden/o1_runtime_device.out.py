import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
device = torch.device(args.device)

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
amp_device_type = next(model.parameters()).device.type
scaler = torch.amp.GradScaler(amp_device_type)

for step in range(10):
    x = torch.randn(32, 8, device=device)
    with torch.autocast(device_type=amp_device_type, dtype=torch.float16):
        loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    scaler.scale(loss).backward(retain_graph=False)
    scaler.step(optimizer)
    scaler.update()
