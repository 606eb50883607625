"""Transformer-XL's loop: `train` calls a helper whose scale_loss (in an `elif` of the precision choice) makes the
scaled backward of each micro-batch, then clips once and steps once, choosing between torch's own GradScaler and
apex by the script's flags; `main` calls `train`. The step follows the scaled backward in its own function (through
the helper), and the `if` around it chooses how to step, not whether: no TODO."""
import argparse

import torch
from apex import amp


def train_iteration(model, x, scaler, optimizer, args):
    loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)) / args.chunks
    if args.fp16:
        if args.amp == "pytorch":
            scaler.scale(loss).backward()
        elif args.amp == "apex":
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
    else:
        loss.backward()
    return loss.item()


def train(model, optimizer, scaler, args):
    total = 0.0
    for _ in range(4):
        optimizer.zero_grad()
        for chunk in torch.randn(8 * args.chunks, 16).chunk(args.chunks):
            total += train_iteration(model, chunk, scaler, optimizer, args)
        if args.fp16:
            if args.amp == "pytorch":
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            elif args.amp == "apex":
                torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.5)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if args.fp16 and args.amp == "pytorch":
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--amp", choices=["pytorch", "apex"], default="apex")
    parser.add_argument("--chunks", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    scaler = None
    if args.fp16:
        if args.amp == "pytorch":
            scaler = torch.amp.GradScaler("cpu")
        elif args.amp == "apex":
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    print(f"{train(model, optimizer, scaler, args):.4f}")


main()
