"""Two-file training (the apex imagenet shape, split in two): amp.initialize here, the scaled backward
and the step in train_loop.train(), which receives the optimizer from this file. Prints a loss a step."""
import argparse

import torch
from apex import amp

from train_loop import train


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 8, generator=generator), torch.randint(0, 3, (16,), generator=generator))
               for _ in range(args.steps)]
    train(batches, model, criterion, optimizer)
    print("loss scale", amp._amp_state.loss_scalers[0].loss_scale())


if __name__ == "__main__":
    main()
