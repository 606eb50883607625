"""A training script shaped like timm's train.py: amp chosen at run time, the forward under a context
manager passed in as an argument, and loss scaling through a scaler object from another module."""
import argparse
from contextlib import suppress
from functools import partial

import torch
import torch.nn as nn

import utils

try:
    from apex import amp
    has_apex = True
except ImportError:
    has_apex = False


def train_one_epoch(model, loader, optimizer, amp_autocast=suppress, loss_scaler=None):
    model.train()
    for x, y in loader:
        with amp_autocast():
            output = model(x)
            loss = nn.functional.cross_entropy(output, y)
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler(loss, optimizer)
        else:
            loss.backward()
            optimizer.step()
        print(f"loss {loss.item():.4f} dtype {output.dtype} scaler {type(loss_scaler).__name__}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--apex-amp", action="store_true")
    parser.add_argument("--native-amp", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    use_amp = None
    if args.apex_amp and has_apex:
        use_amp = "apex"
    elif args.native_amp:
        use_amp = "native"

    amp_autocast = suppress  # do nothing
    loss_scaler = None
    if use_amp == "native":
        amp_autocast = partial(torch.autocast, device)
        loss_scaler = utils.NativeScaler(device)
    elif use_amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        loss_scaler = utils.ApexScaler()

    loader = [(torch.randn(8, 16, device=device), torch.randint(0, 4, (8,), device=device))
              for _ in range(args.steps)]
    train_one_epoch(model, loader, optimizer, amp_autocast=amp_autocast, loss_scaler=loss_scaler)
    checkpoint = {"model": model.state_dict()}
    if loss_scaler is not None:
        checkpoint[loss_scaler.state_dict_key] = loss_scaler.state_dict()


if __name__ == "__main__":
    main()
