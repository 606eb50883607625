"""An evaluation forward in a function that cannot see the amp flag: its float32 note says to pass the flag in."""
import argparse
import torch
from apex import amp


def val_epoch(model, x):
    with torch.no_grad():
        return model(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action="store_true")
    args = parser.parse_args()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.amp:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for step in range(2):
        loss = model(torch.randn(2, 4)).sum()
        if args.amp:
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
        else:
            loss.backward()
        optimizer.step()
    print(val_epoch(model, torch.randn(2, 4)))


main()
