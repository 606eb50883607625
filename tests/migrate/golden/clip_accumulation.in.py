"""Gradient accumulation that clips after every micro-batch and steps every N (Swin-Transformer's
train_one_epoch): GradScaler unscales once per step, so no unscale_ can go before this clip; a TODO."""
import torch
from apex import amp

ACCUMULATION_STEPS = 4
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
optimizer.zero_grad()
for idx in range(8):
    x = torch.randn(8, 16)
    loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)) / ACCUMULATION_STEPS
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.5)
    if (idx + 1) % ACCUMULATION_STEPS == 0:
        optimizer.step()
        optimizer.zero_grad()
