import torch
from apex import amp

model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for i in range(2):
	loss = model(torch.randn(2, 4)).sum()  # tab-indented, CRLF
	with amp.scale_loss(loss, optimizer) as scaled:
		scaled.backward()
	optimizer.step()
