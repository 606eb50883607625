"""Transformer-XL's loop: `train` calls a helper whose scale_loss (in an `elif` of the precision choice) makes the
scaled backward of each micro-batch, then clips once and steps once, choosing between torch's own GradScaler and
apex by the script's flags; `main` calls `train`. The step follows the scaled backward in its own function (through
the helper), and the `if` around it chooses how to step, not whether: no TODO."""
import argparse

import torch


# apexlite migrate: train_iteration() takes the GradScaler that replaced amp (`scaler_2=`); every
#     call migrate saw passes it
def train_iteration(model, x, scaler, optimizer, args, *, scaler_2):
    with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=scaler_2.is_enabled()):
        loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)) / args.chunks
    if args.fp16:
        if args.amp == "pytorch":
            scaler.scale(loss).backward()
        elif args.amp == "apex":
            scaler_2.scale(loss).backward()
    else:
        loss.backward()
    return loss.item()


# apexlite migrate: train() takes the GradScaler that replaced amp (`scaler_2=`); every call migrate
#     saw passes it
def train(model, optimizer, scaler, args, *, scaler_2):
    total = 0.0
    for _ in range(4):
        optimizer.zero_grad()
        for chunk in torch.randn(8 * args.chunks, 16).chunk(args.chunks):
            total += train_iteration(model, chunk, scaler, optimizer, args, scaler_2=scaler_2)
        if args.fp16:
            if args.amp == "pytorch":
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            elif args.amp == "apex":
                scaler_2.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_((p for group in optimizer.param_groups for p in group["params"]), 0.5)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if args.fp16 and args.amp == "pytorch":
            scaler.step(optimizer)
            scaler.update()
        else:
            scaler_2.step(optimizer)
            scaler_2.update()
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
    # apexlite migrate: amp.initialize (opt_level O1) ran only when `args.fp16 and not (args.amp ==
    #     "pytorch") and args.amp == "apex"`: it became torch.autocast(float16) around the forward pass
    #     and the loss and torch.amp.GradScaler (scaler_2), on every path, enabled by that flag
    scaler_2 = torch.amp.GradScaler("cpu", enabled=args.fp16 and not (args.amp == "pytorch") and args.amp == "apex")
    if args.fp16:
        if args.amp == "pytorch":
            scaler = torch.amp.GradScaler("cpu")
        elif args.amp == "apex":
            pass
    print(f"{train(model, optimizer, scaler, args, scaler_2=scaler_2):.4f}")


main()
