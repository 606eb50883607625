import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--opt_level", default="O1")
args = parser.parse_args()
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# TODO(apexlite migrate): opt_level is chosen at run time (`args.opt_level`, whose argparse default
#     is 'O1'): run migrate again with --opt-level O0|O1|O2|O3, the level you train with (e.g.
#     --opt-level O1)
model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
loss = model(torch.randn(2, 4)).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
