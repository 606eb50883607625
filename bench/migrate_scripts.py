"""Legacy apex training scripts of any length, built from the fragments real ones are made of, for
bench_migrate.py: a header (imports, argument parsing), then numbered copies of a model block (a module
with FusedLayerNorm, an init function), a utilities block (meters, a learning-rate schedule, a checkpoint
with amp's state), a train function (scale_loss, clipping amp.master_params, optimizer.step) and an
evaluation function, and a main that builds the models, FusedAdam, amp.initialize and DDP and trains at
module level. Every copy gets its own names, so the script is one program that compiles.
"""
from __future__ import annotations

HEADER = '''"""Generated legacy apex training script ({lines} lines requested)."""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp
from apex.normalization import FusedLayerNorm
from apex.optimizers import FusedAdam
from apex.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser(description="generated")
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--clip", type=float, default=1.0)
parser.add_argument("--opt-level", default="O1")
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()
'''

BLOCK = '''

class Block{k}(nn.Module):
    """Residual MLP block {k}."""

    def __init__(self, width, hidden, dropout=0.1):
        super().__init__()
        self.norm = FusedLayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        residual = x
        x = self.norm(x)
        x = F.gelu(self.fc1(x))
        x = self.dropout(self.fc2(x))
        return residual + x


def init_weights_{k}(module, std=0.02):
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, FusedLayerNorm):
        nn.init.ones_(module.weight)


class AverageMeter{k}:
    """Running average of a metric."""

    def __init__(self, name):
        self.name = name
        self.reset()

    def reset(self):
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def adjust_learning_rate_{k}(optimizer, epoch, step, steps_per_epoch, base_lr, warmup=5):
    progress = epoch + step / steps_per_epoch
    if progress < warmup:
        lr = base_lr * progress / warmup
    else:
        lr = base_lr * 0.5 * (1 + math.cos(math.pi * (progress - warmup) / 90))
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def save_checkpoint_{k}(path, model, optimizer, epoch):
    state = {{"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "amp": amp.state_dict()}}
    torch.save(state, os.path.join(path, "checkpoint_{k}.pt"))


def train_{k}(model, optimizer, batches, epoch):
    meter = AverageMeter{k}("loss")
    model.train()
    for step, (x, y) in enumerate(batches):
        adjust_learning_rate_{k}(optimizer, epoch, step, len(batches), args.lr)
        output = model(x)
        loss = F.mse_loss(output, y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.clip)
        optimizer.step()
        meter.update(loss.item(), x.size(0))
    return meter.avg


def evaluate_{k}(model, batches):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in batches:
            total += F.mse_loss(model(x), y, reduction="sum").item()
            count += x.numel()
    return total / max(count, 1)
'''

MAIN = '''

torch.manual_seed(0)
model = nn.Sequential({blocks}).cuda()
model.apply(init_weights_0)
optimizer = FusedAdam(model.parameters(), lr=args.lr, weight_decay=0.01)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1", loss_scale="dynamic")
model = DDP(model, delay_allreduce=True)
for epoch in range(args.epochs):
    start = time.time()
    for step in range(args.steps):
        x = torch.randn(8, 16).cuda()
        y = torch.randn(8, 16).cuda()
        output = model(x)
        loss = F.mse_loss(output, y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.clip)
        optimizer.step()
    print("epoch", epoch, "loss", loss.item(), "time", time.time() - start)
checkpoint = {{"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()}}
torch.save(checkpoint, "final.pt")
'''


def generate(lines: int) -> str:
    """A script of about `lines` lines (never fewer than one copy of each fragment)."""
    header = HEADER.format(lines=lines)
    block_lines = BLOCK.format(k=0).count("\n")
    copies = max(1, round((lines - header.count("\n") - MAIN.count("\n")) / block_lines))
    blocks = "".join(BLOCK.format(k=k) for k in range(copies))
    main = MAIN.format(blocks=", ".join(f"Block{k}(16, 64)" for k in range(min(copies, 4))))
    return header + blocks + main
