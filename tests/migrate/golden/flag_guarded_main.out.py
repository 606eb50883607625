"""A flag inside the script's `if __name__ == "__main__":` block: that test is no condition (it holds
whenever the script trains), so the GradScaler goes above the flag's `if`, inside the block, where
`args` exists."""
import argparse

import torch

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # apexlite migrate: amp.initialize (opt_level O1) ran only when `args.fp16`: it became
    #     torch.autocast(float16) around the forward pass and the loss and torch.amp.GradScaler
    #     (scaler), on every path, enabled by that flag
    scaler = torch.amp.GradScaler("cpu", enabled=args.fp16)
    for _ in range(3):
        with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=args.fp16):
            loss = model(torch.randn(2, 2)).sum()
        if args.fp16:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        scaler.step(optimizer)
        scaler.update()
