import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")
accumulate = 4
for index, x in enumerate(torch.randn(16, 2, 4)):
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = model(x).pow(2).mean() / accumulate
    stepping = (index + 1) % accumulate == 0
    scaler.scale(loss).backward()
    if stepping:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
