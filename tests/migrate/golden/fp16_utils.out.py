import torch

model = torch.nn.Linear(2, 2)
loss = model(torch.randn(3, 2)).sum()
loss.backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
print("loss", loss.item(), (loss * 2).item())
