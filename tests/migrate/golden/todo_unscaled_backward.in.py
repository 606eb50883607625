"""An unscaled backward (a regulariser) stepped through the same optimizer as a scaled loss: the GradScaler
would divide its grads by the loss scale, so the step after it is a TODO. The step before it reads only the scaled
grads (the zero_grad after the regulariser's step clears them), and is left as it is."""
import torch
from apex import amp


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
g = torch.Generator().manual_seed(0)
for i in range(10):
    x = torch.randn(8, 16, generator=g)
    loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    reg = sum(p.pow(2).sum() for p in model.parameters()) * 1e-3
    reg.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(i, loss.item(), reg.item())
