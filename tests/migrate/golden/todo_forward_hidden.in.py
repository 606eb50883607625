"""The loss comes from a forward migrate cannot see (the model reached through a dict): no region is guessed, and in
particular none around the data made before the loop after amp.initialize; a TODO says to place autocast."""
import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
nets = {"main": model}
data = torch.randn(4, 16, 8)
for step in range(4):
    x = data[step]
    output = nets["main"](x)
    loss = output.float().pow(2).mean()
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
