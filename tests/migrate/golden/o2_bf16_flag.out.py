"""tacotron2's shape: O2 under `if hparams.fp16_run:` migrated to bf16 autocast; the notes stand where the
removed `if` stood, at its indentation."""
import torch


class HParams:
    fp16_run = True


hparams = HParams()
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
# apexlite migrate: O2 (fp16 weights, fp32 master weights) became bf16 autocast over the fp32 model
#     (--o2=bf16-autocast); bf16 needs no loss scaling
# apexlite migrate: amp.initialize (opt_level O2) ran only when `bool(hparams.fp16_run)`: it became
#     torch.autocast(bfloat16) around the forward pass and the loss, on every path, enabled by that
#     flag
for _ in range(3):
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=bool(hparams.fp16_run)):
        loss = model(torch.randn(2, 4)).float().sum()
    if hparams.fp16_run:
        loss.backward()
    else:
        loss.backward()
    optimizer.step()
