"""A test that apex imported and an edit of apex's O1 op lists: each TODO says what to do instead."""
import torch
from apex import amp

assert amp is not None, "install apex"
amp.lists.functional_overrides.FP32_FUNCS.remove("softmax")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
loss = model(torch.randn(2, 4)).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
