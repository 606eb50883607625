"""tacotron2's shape: O2 under `if hparams.fp16_run:` migrated to bf16 autocast; the notes stand where the
removed `if` stood, at its indentation."""
import torch


class HParams:
    fp16_run = True


hparams = HParams()
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
if hparams.fp16_run:
    from apex import amp
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
for _ in range(3):
    loss = model(torch.randn(2, 4)).float().sum()
    if hparams.fp16_run:
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
    else:
        loss.backward()
    optimizer.step()
