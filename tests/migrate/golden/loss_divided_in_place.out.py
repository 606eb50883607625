"""Gradient accumulation that divides the loss in place (`loss /= steps`, FastPitch's train.py): the loss is
still traced to its forward pass, which goes under torch.autocast."""
import torch

accumulation_steps = 2
model = torch.nn.Linear(4, 2)
criterion = torch.nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")
for step in range(4):
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        y_pred = model(x)
        loss = criterion(y_pred, y)
        loss /= accumulation_steps
    scaler.scale(loss).backward()
    if (step + 1) % accumulation_steps == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
