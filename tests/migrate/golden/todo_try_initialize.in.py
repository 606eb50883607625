"""amp.initialize inside a `try` that may skip it: a GradScaler made there would be undefined on the
`except` path, so the amp part stays (with a TODO); the rest of the script is still migrated."""
import torch
from apex import amp
from apex.optimizers import FusedAdam

model = torch.nn.Linear(2, 2)
optimizer = FusedAdam(model.parameters(), lr=1e-3)
try:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
except RuntimeError as error:
    print("training in fp32:", error)
for _ in range(3):
    loss = model(torch.randn(2, 2)).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
