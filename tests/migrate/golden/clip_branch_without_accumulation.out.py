"""A training loop with two branches, one accumulating gradients (no clip there) and one clipping and stepping every
batch (Swin-Transformer's train_one_epoch without its accumulation clip): the clip gets scaler.unscale_ before it,
and the accumulation branch's guarded step, which never follows this clip, is no reason for a TODO."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")


def train_one_epoch(accumulation_steps):
    grad_norm = None
    optimizer.zero_grad()
    for idx in range(8):
        x = torch.randn(8, 16)
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
        if accumulation_steps > 1:
            loss = loss / accumulation_steps
            scaler.scale(loss).backward()
            if (idx + 1) % accumulation_steps == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        else:
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(optimizer)
            scaler.update()
    return grad_norm


last_norm = train_one_epoch(1)
train_one_epoch(4)
