"""A flag inside the script's `if __name__ == "__main__":` block: that test is no condition (it holds
whenever the script trains), so the GradScaler goes above the flag's `if`, inside the block, where
`args` exists."""
import argparse

import torch
from apex import amp

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for _ in range(3):
        loss = model(torch.randn(2, 2)).sum()
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
        else:
            loss.backward()
        optimizer.step()
