import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer)
accumulate = 4
for index, x in enumerate(torch.randn(16, 2, 4)):
    loss = model(x).pow(2).mean() / accumulate
    stepping = (index + 1) % accumulate == 0
    with amp.scale_loss(loss, optimizer, delay_unscale=not stepping) as scaled_loss:
        scaled_loss.backward()
    if stepping:
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
