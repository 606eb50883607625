"""A backward helper (`def backward(loss, optimizer)`) that scales a loss computed by its callers: the
forward passes and the losses go under torch.autocast where each call's argument is computed."""
import torch


# apexlite migrate: backward() takes the GradScaler that replaced amp (`scaler=`); every call
#     migrate saw passes it
def backward(loss, optimizer, *, scaler):
    scaler.scale(loss).backward()


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
    #     pass and the loss and torch.amp.GradScaler (scaler)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(4):
        optimizer.zero_grad()
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out, y)
        backward(loss, optimizer, scaler=scaler)
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            extra = model(x).pow(2).mean()
        backward(extra, optimizer, scaler=scaler)
        scaler.step(optimizer)
        scaler.update()
        print(step, loss.item(), extra.item())
    return out


out = main()
