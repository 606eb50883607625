"""Swin-Transformer's train_one_epoch keeps two branches: with gradient accumulation it clips every micro-batch and
steps every N (a TODO: GradScaler unscales once per step), without it it clips and steps every batch, so the clip
of that branch gets scaler.unscale_ before it. The steps of one branch never follow the other branch's clip."""
import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")


def train_one_epoch(accumulation_steps):
    optimizer.zero_grad()
    for idx in range(8):
        x = torch.randn(8, 16)
        loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
        if accumulation_steps > 1:
            loss = loss / accumulation_steps
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            # TODO(apexlite migrate): this clip runs on iterations where the optimizer does not step (gradient
            #     accumulation); torch.amp's GradScaler unscales once per step, so `scaler.unscale_(optimizer)`
            #     cannot go here: clip once, after it, right before the step
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.5)
            if (idx + 1) % accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        else:
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.5)
            optimizer.step()


train_one_epoch(1)
train_one_epoch(4)
