"""An evaluation forward in a function that cannot see the amp flag: its float32 note says to pass the flag in."""
import argparse
import torch


def val_epoch(model, x):
    with torch.no_grad():
        # apexlite migrate: `model(...)` here runs in float32 now (apex's O1 ran every forward in low
        #     precision); for that, run it under `with torch.autocast(device_type="cpu",
        #     dtype=torch.float16, enabled=args.amp):` (`args` is not defined here: pass it in)
        return model(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action="store_true")
    args = parser.parse_args()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # apexlite migrate: amp.initialize (opt_level O1) ran only when `args.amp`: it became
    #     torch.autocast(float16) around the forward pass and the loss and torch.amp.GradScaler
    #     (scaler), on every path, enabled by that flag
    scaler = torch.amp.GradScaler("cpu", enabled=args.amp)
    for step in range(2):
        with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=args.amp):
            loss = model(torch.randn(2, 4)).sum()
        if args.amp:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        scaler.step(optimizer)
        scaler.update()
    print(val_epoch(model, torch.randn(2, 4)))


main()
