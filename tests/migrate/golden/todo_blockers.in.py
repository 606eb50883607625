"""Every blocker in one run (apex's imagenet main_amp.py shape): the opt level and the loss scale chosen
at run time, and a scale_loss in a train() handed on as a callback; the report names all three
and the flags a second run needs."""
import argparse

import torch
from apex import amp


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--opt-level", type=str)
    parser.add_argument("--keep-batchnorm-fp32", type=str, default=None)
    parser.add_argument("--loss-scale", type=str, default=None)
    return parser.parse_args()


def main():
    args = parse()
    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level,
                                      keep_batchnorm_fp32=args.keep_batchnorm_fp32, loss_scale=args.loss_scale)
    run_epochs(train, model, optimizer, epochs=2)


def run_epochs(step, model, optimizer, epochs):
    for epoch in range(epochs):
        step(model, optimizer)


def train(model, optimizer):
    for _ in range(3):
        loss = model(torch.randn(2, 4).cuda()).sum()
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
