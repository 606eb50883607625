"""A step before any backward (UNITER's "quick hack for amp delay_unscale bug" right after amp.initialize):
it stays a plain optimizer.step(); GradScaler.step would refuse it, nothing being scaled yet."""
import torch

torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")
optimizer.zero_grad()
# apexlite migrate: `optimizer.step()` runs before any scaled backward, so it stays a plain step
#     (scaler.step would refuse it: nothing was scaled yet)
optimizer.step()
for step in range(4):
    x = torch.randn(8, 16)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
