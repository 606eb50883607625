"""The scaled backward in the `else` of `if not fp16:`: the same flag as amp.initialize's `if fp16:`, so
the plain backward runs exactly when the GradScaler is disabled. A `try` that only tried apex goes."""
import torch


def main(fp16):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # apexlite migrate: amp.initialize (opt_level O1) ran only when `bool(fp16)`: it became
    #     torch.autocast(float16) around the forward pass and the loss and torch.amp.GradScaler
    #     (scaler), on every path, enabled by that flag
    scaler = torch.amp.GradScaler("cpu", enabled=bool(fp16))
    with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=bool(fp16)):
        loss = model(torch.randn(2, 2)).sum()
    if not fp16:
        loss.backward()
    else:
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
