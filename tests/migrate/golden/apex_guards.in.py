"""The ways scripts guard apex imports: a HAS_APEX flag, a try that only re-raises with an install hint,
and the always-true `multi_tensor_applier.available`. Once apex is gone nothing in them can fail."""
import argparse

import torch

try:
    from apex import amp
    HAS_APEX = True
except ImportError:
    HAS_APEX = False
try:
    from apex.fp16_utils import *
    from apex.multi_tensor_apply import multi_tensor_applier
except ImportError:
    raise ImportError("Please install apex from https://www.github.com/nvidia/apex to run this example.")

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
args = parser.parse_args()
print("multi_tensor_applier.available = {}".format(multi_tensor_applier.available))
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if HAS_APEX and args.fp16:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for _ in range(3):
    loss = model(torch.randn(2, 2)).sum()
    if HAS_APEX and args.fp16:
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
    else:
        loss.backward()
    optimizer.step()
    print("loss", to_python_float(loss))
