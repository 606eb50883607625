"""NVIDIA TimeSeriesPredictionPlatform turns amp off where apex is not installed, by looking it up: the migrated
script no longer imports apex, so that test would turn mixed precision off wherever apex is missing; a TODO."""
import importlib.util
import torch
import torch.nn as nn
try:
    from apex import amp
except ImportError:
    print("Nvidia apex not available.")

amp_enabled = True
if not importlib.util.find_spec("apex"):
    amp_enabled = False
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
if amp_enabled:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", loss_scale="dynamic")
print("amp_enabled", amp_enabled, "weight dtype", next(model.parameters()).dtype)
for i in range(4):
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    optimizer.zero_grad()
    loss = ((model(x).float() - y) ** 2).mean()
    if amp_enabled:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()
    optimizer.step()
    print("loss", loss.item())
