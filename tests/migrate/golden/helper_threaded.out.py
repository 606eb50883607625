"""scale_loss inside a helper that receives the optimizer from every call: the GradScaler is passed in too."""
import torch


# apexlite migrate: train_step() takes the GradScaler that replaced amp (`scaler=`); every call
#     migrate saw passes it
def train_step(model, optimizer, batch, *, scaler):
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = model(batch).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def main():
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
    #     pass and the loss and torch.amp.GradScaler (scaler)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(3):
        train_step(model, optimizer, torch.randn(2, 4), scaler=scaler)
