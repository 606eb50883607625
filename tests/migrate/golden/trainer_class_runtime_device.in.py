"""A training class handed its model and optimizer: the device is known only at run time, so it is read from the
model beside amp.initialize into an attribute every method reads (self.amp_device_type), as the GradScaler is."""
import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, opt_level):
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level=opt_level)

    def train_step(self, x):
        loss = self.model(x).float().pow(2).mean()
        with amp.scale_loss(loss, self.optimizer) as scaled:
            scaled.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss

    @staticmethod
    def describe():
        return "trainer"


torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
trainer = Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), "O1")
for step in range(4):
    loss = trainer.train_step(torch.randn(8, 8))
