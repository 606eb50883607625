"""The loss is computed in a helper whose body runs the model: autocast goes around the call, not the def."""
import torch
from apex import amp

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")


def compute_loss(batch):
    return model(batch).pow(2).mean()


for step in range(3):
    loss = compute_loss(torch.randn(8, 4))
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    optimizer.zero_grad()


def evaluate(batch):
    return model(batch)


with torch.no_grad():
    print(evaluate(torch.randn(2, 4)))
