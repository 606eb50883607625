import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--opt_level", default="O1")
args = parser.parse_args()
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
loss = model(torch.randn(2, 4)).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
