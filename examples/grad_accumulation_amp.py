"""Gradient accumulation + gradient clipping with apex.amp (legacy API, unchanged), synthetic data.

Every `--accum-steps` micro-batches make one optimizer step. Intermediate micro-batches use
`delay_unscale=True`; the last one unscales, so `clip_grad_norm_(amp.master_params(optimizer))`
sees true gradients (this is apex's documented recipe).
    python -m apexlite run examples/grad_accumulation_amp.py --opt-level O2 --accum-steps 4
"""
import argparse

import torch
import torch.nn as nn

from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--opt-level", default="O1")
parser.add_argument("--accum-steps", type=int, default=4)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--max-grad-norm", type=float, default=1.0)
parser.add_argument("--micro-batch", type=int, default=8)
args = parser.parse_args()
torch.manual_seed(0)

true_w = torch.randn(16, 1)
data = torch.randn(args.accum_steps, args.micro_batch, 16)  # one fixed batch, split into micro-batches
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)

for step in range(args.steps):
    total = 0.0
    for micro in range(args.accum_steps):
        x = data[micro]
        y = x @ true_w
        loss = nn.functional.mse_loss(model(x).float(), y) / args.accum_steps
        last = micro == args.accum_steps - 1
        with amp.scale_loss(loss, optimizer, delay_unscale=not last) as scaled_loss:
            scaled_loss.backward()
        total += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad()
    print("step {} loss {:.4f} grad_norm_before_clip {:.4f} loss_scale {}".format(
        step, total, float(grad_norm), amp._amp_state.loss_scalers[0].loss_scale()))
