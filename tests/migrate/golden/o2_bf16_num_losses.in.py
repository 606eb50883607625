"""O2 with num_losses and loss_id read at run time (UNITER: one loss id per task), migrated to bf16 autocast:
nothing is scaled there, so neither needs to be a literal."""
import torch
from apex import amp


class Opts:
    tasks = ["a", "b"]


opts = Opts()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
model, optimizer = amp.initialize(model, optimizer, opt_level="O2", num_losses=len(opts.tasks))
for step in range(4):
    for task_id, task in enumerate(opts.tasks):
        loss = model(torch.randn(4, 8)).float().pow(2).mean()
        with amp.scale_loss(loss, optimizer, loss_id=task_id, delay_unscale=task_id == 0) as scaled:
            scaled.backward()
    optimizer.step()
    optimizer.zero_grad()
