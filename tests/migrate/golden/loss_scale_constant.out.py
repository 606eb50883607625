"""A loss scale of 1.0 needs no GradScaler: the printed scale becomes the constant, written into the
f-string's text."""
import torch

model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss
with torch.autocast(device_type="cpu", dtype=torch.float16):
    loss = model(torch.randn(2, 2)).sum()
loss.backward()
optimizer.step()
print(f"loss {loss.item():.3f} scale 1.0")
