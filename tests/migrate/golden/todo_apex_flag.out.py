"""amp run only when apex imported (`if amp is not None:`): a test of apex itself, which the migrated
script no longer has; the TODO asks for the script's own flag."""
import torch
try:
    from apex import amp
except ImportError:
    amp = None
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if amp is not None:
    # TODO(apexlite migrate): amp.initialize runs only when `amp is not None`, a test of apex itself,
    #     which the migrated script no longer imports: test your own flag (e.g. --fp16) instead and run
    #     migrate again
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
loss = model(torch.randn(2, 2)).sum()
loss.backward()
optimizer.step()
