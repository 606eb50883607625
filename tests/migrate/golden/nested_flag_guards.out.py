"""Swin-Transformer's train_one_epoch shape: an accumulation `if` whose branches each test the flag
amp.initialize ran under around scale_loss, and a loss rescaled inside the branch (`loss = loss / N`):
the autocast region is the forward before the `if`."""
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--amp-opt-level", default="O1", choices=["O0", "O1"])
parser.add_argument("--accumulation-steps", type=int, default=2)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: migrated for opt_level O1 (the script chose `args.amp_opt_level` at run time)
# apexlite migrate: amp.initialize (opt_level O1) ran only when `args.amp_opt_level != "O0"`: it
#     became torch.autocast(float16) around the forward pass and the loss and torch.amp.GradScaler
#     (scaler), on every path, enabled by that flag
scaler = torch.amp.GradScaler("cpu", enabled=args.amp_opt_level != "O0")

for idx in range(4):
    x = torch.randn(8, 16)
    with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=args.amp_opt_level != "O0"):
        outputs = model(x)
        loss = torch.nn.functional.cross_entropy(outputs, x[:, :4].argmax(1))
    if args.accumulation_steps > 1:
        loss = loss / args.accumulation_steps
        if args.amp_opt_level != "O0":
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if (idx + 1) % args.accumulation_steps == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    else:
        optimizer.zero_grad()
        if args.amp_opt_level != "O0":
            scaler.scale(loss).backward()
        else:
            loss.backward()
        scaler.step(optimizer)
        scaler.update()
