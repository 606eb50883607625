"""A step before any backward (UNITER's "quick hack for amp delay_unscale bug" right after amp.initialize):
it stays a plain optimizer.step(); GradScaler.step would refuse it, nothing being scaled yet."""
import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
optimizer.zero_grad()
optimizer.step()
for step in range(4):
    x = torch.randn(8, 16)
    loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    optimizer.zero_grad()
