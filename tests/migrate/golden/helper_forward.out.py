"""The loss is computed in a helper whose body runs the model: autocast goes around the call, not the def."""
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")


def compute_loss(batch):
    return model(batch).pow(2).mean()


for step in range(3):
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = compute_loss(torch.randn(8, 4))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()


def evaluate(batch):
    # apexlite migrate: `model(...)` here runs in float32 now (apex's O1 ran every forward in low
    #     precision); for that, run it under `with torch.autocast(device_type="cpu",
    #     dtype=torch.float16):`
    return model(batch)


with torch.no_grad():
    print(evaluate(torch.randn(2, 4)))
