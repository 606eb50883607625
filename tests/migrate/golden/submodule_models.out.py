"""DLRM (NVIDIA DeepLearningExamples) gives amp.initialize two submodules of its model; the loop calls the whole model,
which runs them: its forward and loss go under autocast (they used to be missed, and autocast went around the data
tensor made before the loop, with the migration reported complete)."""
import torch
import torch.nn as nn


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
# apexlite migrate: O2 (fp16 weights, fp32 master weights) became bf16 autocast over the fp32 model
#     (--o2=bf16-autocast); bf16 needs no loss scaling
# apexlite migrate: amp.initialize (opt_level O2) became torch.autocast(bfloat16) around the forward
#     pass and the loss
(model.top_model, model.bottom_model), optimizer = [model.top_model, model.bottom_model], optimizer
amp_device_type = next(model.top_model.parameters()).device.type

loss_fn = torch.nn.BCEWithLogitsLoss(reduction="mean")
data_stream = torch.randn(10, 16, 8)
for step in range(4):
    x = data_stream[step]
    click = (x.sum(1) > 0).float()
    with torch.autocast(device_type=amp_device_type, dtype=torch.bfloat16):
        output = model(x).squeeze()
        loss = loss_fn(output.float(), click)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print("loss", loss.item())
