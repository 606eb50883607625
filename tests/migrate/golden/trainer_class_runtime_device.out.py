"""A training class handed its model and optimizer: the device is known only at run time, so it is read from the
model beside amp.initialize into an attribute every method reads (self.amp_device_type), as the GradScaler is."""
import torch


class Trainer:
    def __init__(self, model, optimizer, opt_level):
        # apexlite migrate: migrated for opt_level O1 (the script chose `opt_level` at run time)
        # apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
        #     pass and the loss and torch.amp.GradScaler (self.scaler), enabled when `opt_level != "O0"` (O0
        #     at run time is fp32)
        self.model, self.optimizer = model, optimizer
        self.amp_device_type = next(self.model.parameters()).device.type
        self.scaler = torch.amp.GradScaler(self.amp_device_type, enabled=opt_level != "O0")

    def train_step(self, x):
        with torch.autocast(device_type=self.amp_device_type, dtype=torch.float16, enabled=self.scaler.is_enabled()):
            loss = self.model(x).float().pow(2).mean()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
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
