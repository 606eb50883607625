"""O3 in float16 with a loss scale: torch.amp.GradScaler refuses to unscale float16 grads, so plain torch has
no form of it and amp stays, imported from apexlite."""
import torch
from apexlite import amp

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp stays on apexlite: O3 with loss_scale=128.0 has no plain-torch form
#     (torch.amp.GradScaler refuses to unscale fp16 gradients); to go native, train with O1
#     (torch.autocast) and a GradScaler instead
model, optimizer = amp.initialize(model, optimizer, opt_level="O3", loss_scale=128.0)
for step in range(4):
    x = torch.randn(8, 8)
    loss = model(x).float().pow(2).mean()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    optimizer.zero_grad()
