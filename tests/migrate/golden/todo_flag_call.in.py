"""amp under a test that calls something: migrate cannot evaluate it again for autocast and GradScaler."""
import torch
from apex import amp

model = torch.nn.Linear(2, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if torch.cuda.is_available():
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
loss = model(torch.randn(2, 2).cuda()).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
