"""A training loop with two branches, one accumulating gradients (no clip there) and one clipping and stepping every
batch (Swin-Transformer's train_one_epoch without its accumulation clip): the clip gets scaler.unscale_ before it,
and the accumulation branch's guarded step, which never follows this clip, is no reason for a TODO."""
import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")


def train_one_epoch(accumulation_steps):
    grad_norm = None
    optimizer.zero_grad()
    for idx in range(8):
        x = torch.randn(8, 16)
        loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
        if accumulation_steps > 1:
            loss = loss / accumulation_steps
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            if (idx + 1) % accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        else:
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.5)
            optimizer.step()
    return grad_norm


last_norm = train_one_epoch(1)
train_one_epoch(4)
