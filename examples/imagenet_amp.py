"""ImageNet-style apex.amp training script (legacy apex API, unchanged), on built-in synthetic data.

Written as apex users wrote it (examples/imagenet/main_amp.py style): run it with
    python -m apexlite run examples/imagenet_amp.py --opt-level O1
    python -m apexlite run examples/imagenet_amp.py --opt-level O2 --keep-batchnorm-fp32 True --loss-scale 128.0
It prints the loss and loss scale of every step. The data is a fixed synthetic classification task
(labels are a fixed function of the images), so the loss must fall within a few dozen steps.
"""
import argparse
import os
import time

import torch
import torch.nn as nn

from apex import amp, optimizers  # noqa: F401  (legacy scripts import optimizers next to amp)
from apex.fp16_utils import *  # noqa: F401,F403  (to_python_float)
from apex.multi_tensor_apply import multi_tensor_applier
from apex.parallel import DistributedDataParallel as DDP
import apex.parallel


def parse():
    parser = argparse.ArgumentParser(description="ImageNet-style amp training (synthetic data)")
    parser.add_argument("--arch", "-a", default="smallcnn", choices=["smallcnn"])
    parser.add_argument("--epochs", default=1, type=int)
    parser.add_argument("--steps-per-epoch", default=30, type=int)
    parser.add_argument("-b", "--batch-size", default=16, type=int)
    parser.add_argument("--lr", "--learning-rate", default=0.05, type=float)
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--weight-decay", "--wd", default=1e-4, type=float)
    parser.add_argument("--print-freq", "-p", default=1, type=int)
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--local_rank", default=int(os.environ.get("LOCAL_RANK", 0)), type=int)
    parser.add_argument("--sync_bn", action="store_true")
    parser.add_argument("--opt-level", type=str)
    parser.add_argument("--keep-batchnorm-fp32", type=str, default=None)
    parser.add_argument("--loss-scale", type=str, default=None)
    parser.add_argument("--channels-last", type=bool, default=False)
    return parser.parse_args()


class SmallCNN(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


def synthetic_batches(steps, batch_size, seed=0):
    """A learnable task: the label is the colour channel/quadrant with the largest mean brightness."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        images = torch.randn(batch_size, 3, 16, 16, generator=gen)
        labels = torch.randint(0, 10, (batch_size,), generator=gen)
        channel, half = labels % 3, (labels // 3) % 2
        for i in range(batch_size):
            rows = slice(0, 8) if half[i] == 0 else slice(8, 16)
            images[i, channel[i], rows] += 1.5
        yield images, labels


def main():
    args = parse()
    if args.deterministic:
        torch.manual_seed(args.local_rank)
    print("opt_level = {}".format(args.opt_level))
    print("keep_batchnorm_fp32 = {}".format(args.keep_batchnorm_fp32), type(args.keep_batchnorm_fp32))
    print("loss_scale = {}".format(args.loss_scale), type(args.loss_scale))
    print("multi_tensor_applier.available = {}".format(multi_tensor_applier.available))

    args.distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    if args.distributed:
        torch.distributed.init_process_group(backend="gloo", init_method="env://")

    model = SmallCNN()
    if args.sync_bn:
        model = apex.parallel.convert_syncbn_model(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)

    model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level,
                                      keep_batchnorm_fp32=args.keep_batchnorm_fp32, loss_scale=args.loss_scale)
    if args.distributed:
        model = DDP(model, delay_allreduce=True)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for images, target in synthetic_batches(args.steps_per_epoch, args.batch_size, seed=epoch):
            start = time.time()
            output = model(images)
            loss = criterion(output, target)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            if step % args.print_freq == 0:
                print("epoch {} step {} loss {:.4f} loss_scale {} time {:.3f}s".format(
                    epoch, step, to_python_float(loss), amp._amp_state.loss_scalers[0].loss_scale(),  # noqa: F405
                    time.time() - start))
            step += 1

    checkpoint = {"epoch": args.epochs, "arch": args.arch, "state_dict": model.state_dict(),
                  "optimizer": optimizer.state_dict(), "amp": amp.state_dict()}
    dtypes = sorted({str(v.dtype) for v in checkpoint["state_dict"].values() if v.is_floating_point()})
    print("checkpoint state_dict dtypes: {}".format(", ".join(dtypes)))


if __name__ == "__main__":
    main()
