"""SSD (NVIDIA DeepLearningExamples) casts its evaluation input to fp16 itself under --amp, which apex's O1 casts took;
outside torch.autocast the migrated fp32 model would refuse it, so that forward is a TODO (an O1 stand-in: SSD runs O2)."""
import argparse
import torch
import torch.nn as nn
from apex import amp


def evaluate(model, args):
    model.eval()
    with torch.no_grad():
        img = torch.randn(2, 3, 8, 8)
        if args.amp:
            img = img.half()
        # TODO(apexlite migrate): `model(...)` here gets input the script casts to half precision (`img =
        #     img.half()`), which apex's O1 casts took; the migrated model stays float32 outside
        #     torch.autocast and refuses it: run it under `with torch.autocast(device_type="cpu",
        #     dtype=torch.float16, enabled=args.amp):`, or drop the cast
        out = model(img)
    print("eval", out.float().mean().item())


def train_loop(model, optim, args, mean, std):
    for i in range(5):
        img = torch.randn(2, 3, 8, 8)
        if args.amp:
            img = img.half()
        img = (img - mean) / std
        ploc = model(img)
        loss = ploc.float().pow(2).mean()
        if args.amp:
            with amp.scale_loss(loss, optim) as scale_loss:
                scale_loss.backward()
        else:
            loss.backward()
        optim.step()
        optim.zero_grad()
        print("loss", loss.item())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    mean = torch.zeros(1, 3, 1, 1)
    std = torch.ones(1, 3, 1, 1)
    if args.amp:
        mean = mean.half()
        std = std.half()
    ssd300 = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))
    optimizer = torch.optim.SGD(ssd300.parameters(), lr=0.01, momentum=0.9)
    if args.amp:
        ssd300, optimizer = amp.initialize(ssd300, optimizer, opt_level='O1')
    train_loop(ssd300, optimizer, args, mean, std)
    evaluate(ssd300, args)


if __name__ == "__main__":
    main()
