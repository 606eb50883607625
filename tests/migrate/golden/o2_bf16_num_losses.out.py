"""O2 with num_losses and loss_id read at run time (UNITER: one loss id per task), migrated to bf16 autocast:
nothing is scaled there, so neither needs to be a literal."""
import torch


class Opts:
    tasks = ["a", "b"]


opts = Opts()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
# apexlite migrate: O2 (fp16 weights, fp32 master weights) became bf16 autocast over the fp32 model
#     (--o2=bf16-autocast); bf16 needs no loss scaling
# apexlite migrate: amp.initialize (opt_level O2) became torch.autocast(bfloat16) around the forward
#     pass and the loss
for step in range(4):
    for task_id, task in enumerate(opts.tasks):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).float().pow(2).mean()
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
