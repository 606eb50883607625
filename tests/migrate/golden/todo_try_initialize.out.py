"""amp.initialize inside a `try` that may skip it: a GradScaler made there would be undefined on the
`except` path, so the amp part stays (with a TODO); the rest of the script is still migrated."""
import torch
from apex import amp

model = torch.nn.Linear(2, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
try:
    # TODO(apexlite migrate): migrate's rewrite of amp would read `scaler` on a path that does not
    #     define it (amp.initialize runs inside a `try`, loop or branch that other paths skip, or after
    #     that use): create the GradScaler and the device where every path that uses them runs, with
    #     `enabled=` saying when amp is on, or keep apexlite's amp (`from apexlite import amp`)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
except RuntimeError as error:
    print("training in fp32:", error)
for _ in range(3):
    loss = model(torch.randn(2, 2)).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
