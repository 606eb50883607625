"""scale_loss inside a helper that receives the optimizer from every call: the GradScaler is passed in too."""
import torch
from apex import amp


def train_step(model, optimizer, batch):
    loss = model(batch).sum()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()


def main():
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for _ in range(3):
        train_step(model, optimizer, torch.randn(2, 4))
