import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
# apexlite migrate: apex's static loss_scale=128.0: GradScaler has no static mode, so its growth is
#     disabled; unlike apex, an overflowing step is skipped and halves it
scaler = torch.amp.GradScaler("cpu", init_scale=128.0, growth_interval=2**31 - 1)
for _ in range(3):
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = model(torch.randn(2, 4)).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
