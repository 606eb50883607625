"""A ranking model's Trainer (the shape of a BERT ranker found on GitHub): amp.initialize on self.model and
self.optimizer in __init__, a clip of self.model.parameters() after scale_loss in train_ranker (apex had unscaled
the grads when the block exited), so self.scaler.unscale_(self.optimizer) goes before it."""
import torch
import torch.nn as nn
import torch.optim as optim
from apex import amp


class Trainer(object):
    def __init__(self, model, args):
        self.num_epochs = args["num_epochs"]
        self.max_grad_norm = args["max_grad_norm"]
        self.num_gpu = torch.cuda.device_count()
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device)
        self.optimizer = optim.Adam(self.model.parameters(), lr=1e-3)
        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level='O1')
        if self.num_gpu > 1:
            self.model = nn.DataParallel(self.model, device_ids=list(range(self.num_gpu)))

    def train_ranker(self, batches):
        global_step = 0
        for epoch in range(self.num_epochs):
            self.model.train()
            for x, y in batches:
                outputs = self.model(x.to(self.device))
                loss = nn.functional.cross_entropy(outputs, y.to(self.device))
                if self.num_gpu > 1:
                    loss = loss.mean()
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
                nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad()
                global_step += 1
                self.last_loss = float(loss)
        return global_step


torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
data = [(torch.randn(8, 8), torch.randint(0, 2, (8,))) for _ in range(3)]
trainer = Trainer(net, {"num_epochs": 2, "max_grad_norm": 1.0})
trainer.train_ranker(data)
