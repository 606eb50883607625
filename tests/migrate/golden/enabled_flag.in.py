import argparse

import torch
from apex import amp

torch.manual_seed(0)
parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true")
args = parser.parse_args()
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1", enabled=args.amp)
for _ in range(3):
    loss = model(torch.randn(2, 4)).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    with amp.disable_casts():
        print(model(torch.randn(1, 4)))
