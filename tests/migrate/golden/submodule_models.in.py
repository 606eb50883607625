"""DLRM (NVIDIA DeepLearningExamples) gives amp.initialize two submodules of its model; the loop calls the whole model,
which runs them: its forward and loss go under autocast (they used to be missed, and autocast went around the data
tensor made before the loop, with the migration reported complete)."""
import torch
import torch.nn as nn
from apex import amp


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        self.bottom_model = nn.Linear(8, 16)
        self.top_model = nn.Sequential(nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.top_model(self.bottom_model(x))


torch.manual_seed(0)
model = DLRM()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
(model.top_model, model.bottom_model), optimizer = amp.initialize(
    [model.top_model, model.bottom_model], optimizer, opt_level="O2", loss_scale=1)

loss_fn = torch.nn.BCEWithLogitsLoss(reduction="mean")
data_stream = torch.randn(10, 16, 8)
for step in range(4):
    x = data_stream[step]
    click = (x.sum(1) > 0).float()
    output = model(x).squeeze()
    loss = loss_fn(output.float(), click)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    print("loss", loss.item())
