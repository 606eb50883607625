"""Jasper's warm-up: unscaled forward and backward passes before training (to pre-allocate memory), whose grads
`model.zero_grad()` clears at once; they never reach a step, so the training loop's step becomes the GradScaler's
with no TODO."""
import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for size in (4, 8):
    loss = model(torch.randn(size, 16)).sum()
    loss.backward()
    model.zero_grad()
for step in range(6):
    x = torch.randn(8, 16)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
print(f"{loss.item():.4f}")
