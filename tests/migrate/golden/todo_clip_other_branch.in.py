"""A clip in one branch of an `if` in the loop and the only step in the other: no step follows the clip in its
iteration, so GradScaler's unscale_ (once per step) cannot go before it; a TODO."""
import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for idx in range(8):
    x = torch.randn(8, 16)
    loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    if idx % 2 == 0:
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.5)
    else:
        optimizer.step()
        optimizer.zero_grad()
