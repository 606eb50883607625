import torch

model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")
for i in range(2):
	with torch.autocast(device_type="cpu", dtype=torch.float16):
		loss = model(torch.randn(2, 4)).sum()  # tab-indented, CRLF
	scaler.scale(loss).backward()
	scaler.step(optimizer)
	scaler.update()
