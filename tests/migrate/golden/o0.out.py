import io

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O0) became plain fp32 training

for _ in range(3):
    loss = model(torch.randn(2, 4)).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
torch.save({"model": model.state_dict(), "amp": {}}, io.BytesIO())
