# -*- coding: latin-1 -*-
import torch

# Grüße: latin-1 bytes in a comment and a string
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")
with torch.autocast(device_type="cpu", dtype=torch.float16):
    loss = model(torch.randn(2, 4)).sum()
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
print("fertig ä")
