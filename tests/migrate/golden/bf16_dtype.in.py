import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1", dtype=torch.bfloat16)
for _ in range(3):
    loss = model(torch.randn(2, 4)).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    print(amp._amp_state.loss_scalers[0].loss_scale())
