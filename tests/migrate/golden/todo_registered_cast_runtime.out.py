"""A registration of an op that torch.autocast runs in float16 on CUDA, in a script whose device is chosen at run
time: autocast's CPU lists differ, so a TODO says when the line can go. A registration of an op autocast leaves
alone (sigmoid) has no rewrite at all."""
import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true")
args = parser.parse_args()
# TODO(apexlite migrate): torch.autocast on CUDA already runs torch.einsum in its lower precision
#     (float16, or bfloat16 where the script asks for it), but this script may run elsewhere, where
#     autocast's lists differ: delete this line if it trains on CUDA only, else cast the op's inputs
#     where it is called
amp.register_half_function(torch, "einsum")
# TODO(apexlite migrate): `amp.register_half_function` has no certain torch rewrite: torch.autocast
#     has its own op lists: cast inside the function, or decorate it with
#     torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float16)
amp.register_half_function(torch, "sigmoid")
device = torch.device("cuda" if args.cuda else "cpu")
model = torch.nn.Linear(16, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for _ in range(3):
    x = torch.randn(8, 16, device=device)
    loss = torch.sigmoid(torch.einsum("bi,bi->bi", model(x), model(x))).mean()
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
