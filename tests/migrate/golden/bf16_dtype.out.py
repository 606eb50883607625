import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(bfloat16) around the forward
#     pass and the loss
for _ in range(3):
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(2, 4)).sum()
    loss.backward()
    optimizer.step()
    print(1.0)
