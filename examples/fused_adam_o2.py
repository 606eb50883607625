"""apex FusedAdam with amp O2 (fp16 model, fp32 master weights), legacy API unchanged, synthetic data.
    python -m apexlite run examples/fused_adam_o2.py --steps 20
"""
import argparse

import torch
import torch.nn as nn

from apex import amp
from apex.optimizers import FusedAdam

parser = argparse.ArgumentParser()
parser.add_argument("--opt-level", default="O2")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--lr", type=float, default=1e-2)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 4))
optimizer = FusedAdam(model.parameters(), lr=args.lr, weight_decay=0.01)
model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)

x = torch.randn(64, 32)
y = torch.randint(0, 4, (64,))
for step in range(args.steps):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    print("step {} loss {:.4f} loss_scale {}".format(step, loss.item(), amp._amp_state.loss_scalers[0].loss_scale()))

masters = list(amp.master_params(optimizer))
print("model dtype {} master dtype {}".format(next(model.parameters()).dtype, masters[0].dtype))
