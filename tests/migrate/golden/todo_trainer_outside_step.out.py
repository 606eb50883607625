"""A training class whose optimizer is stepped outside the class (`trainer.optimizer.step()`): migrate ties
`self.optimizer` in the class's methods only, so it cannot see that step go through the GradScaler; a TODO."""
import torch
from apex import amp


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

    def backward(self, loss):
        # TODO(apexlite migrate): no `self.optimizer.step()` where migrate can see it; step it with
        #     `self.scaler.step(self.optimizer)` then `self.scaler.update()`
        with amp.scale_loss(loss, self.optimizer) as scaled:
            scaled.backward()

    def save(self):
        return {"model": self.model.state_dict(), "amp": amp.state_dict()}


trainer = Trainer()
for step in range(4):
    loss = trainer.model(torch.randn(8, 8)).float().pow(2).mean()
    trainer.backward(loss)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad()
state = trainer.save()
