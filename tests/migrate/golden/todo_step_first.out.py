"""A step at the top of the loop, before the scaled backward of its iteration: GradScaler.step would refuse it."""
import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
g = torch.Generator().manual_seed(0)
step = 0
while step < 20:
    # TODO(apexlite migrate): this step runs before the scaled backward of its loop iteration;
    #     GradScaler.step needs grads that scaler.scale(...) scaled since the last update: step the
    #     unscaled grads with a plain `optimizer.step()` of their own, or scale every backward before
    #     this step
    optimizer.step()
    optimizer.zero_grad()
    x = torch.randn(8, 16, generator=g)
    loss = torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    print(step, loss.item())
    step += 1
