"""Jasper's warm-up: unscaled forward and backward passes before training (to pre-allocate memory), whose grads
`model.zero_grad()` clears at once; they never reach a step, so the training loop's step becomes the GradScaler's
with no TODO."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")
for size in (4, 8):
    # apexlite migrate: `model(...)` here runs in float32 now (apex's O1 ran every forward in low
    #     precision); for that, run it under `with torch.autocast(device_type="cpu",
    #     dtype=torch.float16):`
    loss = model(torch.randn(size, 16)).sum()
    loss.backward()
    model.zero_grad()
for step in range(6):
    x = torch.randn(8, 16)
    optimizer.zero_grad()
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print(f"{loss.item():.4f}")
