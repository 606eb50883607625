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
    # TODO(apexlite migrate): opt_level is chosen at run time (`args.opt_level`, whose argparse default
    #     is None): run migrate again with --opt-level O0|O1|O2|O3, the level you train with (e.g.
    #     --opt-level O1)
    # TODO(apexlite migrate): loss_scale is chosen at run time (`args.loss_scale`, whose argparse
    #     default is None): run migrate again with --loss-scale dynamic|N, the scale you train with
    #     (e.g. --loss-scale dynamic)
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
        # TODO(apexlite migrate): this scale_loss's optimizer cannot be tied to amp.initialize's: migrate
        #     follows the names amp.initialize assigns, the parameters of functions whose every call it sees
        #     pass the same one of them (a function handed on as a value hides its calls; a helper called
        #     with a generator's and a discriminator's optimizer gets two), and imports of them. Reach the
        #     optimizer one of those ways, or pass a torch.amp.GradScaler in beside it and write
        #     `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
