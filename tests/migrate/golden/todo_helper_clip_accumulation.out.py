"""A backward helper that also clips, called by a loop that steps every N micro-batches: the clip runs where
the optimizer does not step, so no unscale_ can go before it."""
import argparse
import torch
from apex import amp

p = argparse.ArgumentParser()
p.add_argument('--accum', type=int, default=2)
p.add_argument('--fp16', action='store_true')
args = p.parse_args()


def backward(loss, optimizer):
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    # TODO(apexlite migrate): this clip runs on iterations where the optimizer does not step (gradient
    #     accumulation); torch.amp's GradScaler unscales once per step, so `scaler.unscale_(optimizer)`
    #     cannot go here: clip once, after it, right before the step
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.5)


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
g = torch.Generator().manual_seed(0)
for i in range(40):
    x = torch.randn(8, 16, generator=g)
    loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)) / args.accum
    backward(loss, optimizer)
    if (i + 1) % args.accum == 0:
        optimizer.step()
        optimizer.zero_grad()
    print(i, loss.item())
