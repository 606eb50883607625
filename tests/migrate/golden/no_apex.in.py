"""No apex here: migrate leaves the file exactly as it is."""
import torch

model = torch.nn.Linear(2, 2)
with torch.autocast("cpu", dtype=torch.bfloat16):
    print(model(torch.randn(1, 2)))
