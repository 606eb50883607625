"""A training class (many research repositories' Trainer): amp.initialize on `self.model, self.optimizer` in
__init__ under the class's own flag, scale_loss, a clip of amp.master_params and the step in train_step, and
amp's state in the checkpoint methods. The GradScaler becomes an attribute beside them, read by every method."""
import torch
from apex import amp


class Trainer:
    def __init__(self, fp16):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.fp16 = fp16
        if self.fp16:
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

    def train_step(self, x):
        loss = self.model(x).float().pow(2).mean()
        if self.fp16:
            with amp.scale_loss(loss, self.optimizer) as scaled:
                scaled.backward()
            self.grad_norm = torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), 1.0)
        else:
            loss.backward()
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss

    def checkpoint(self):
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.fp16:
            state["amp"] = amp.state_dict()
        return state

    def resume(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.fp16:
            amp.load_state_dict(state["amp"])


trainer = Trainer(fp16=True)
for step in range(4):
    loss = trainer.train_step(torch.randn(8, 8))
trainer.resume(trainer.checkpoint())
loss = trainer.train_step(torch.randn(8, 8))
