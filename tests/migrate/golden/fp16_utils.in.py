import torch
from apex.fp16_utils import *

model = torch.nn.Linear(2, 2)
loss = model(torch.randn(3, 2)).sum()
loss.backward()
clip_grad_norm(model.parameters(), 1.0)
print("loss", to_python_float(loss), to_python_float(loss * 2))
