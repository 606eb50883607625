"""scale_loss inside a helper that is handed on as a value (a callback): migrate cannot see every call,
so it cannot pass the GradScaler in."""
import torch
from apex import amp


def train_step(model, optimizer, batch):
    loss = model(batch).sum()
    # TODO(apexlite migrate): this scale_loss's optimizer cannot be tied to amp.initialize's: migrate
    #     follows the names amp.initialize assigns, the parameters of functions whose every call it sees
    #     pass the same one of them (a function handed on as a value hides its calls; a helper called
    #     with a generator's and a discriminator's optimizer gets two), and imports of them. Reach the
    #     optimizer one of those ways, or pass a torch.amp.GradScaler in beside it and write
    #     `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()


def run(step, model, optimizer):
    for _ in range(3):
        step(model, optimizer, torch.randn(2, 4))


def main():
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    run(train_step, model, optimizer)
