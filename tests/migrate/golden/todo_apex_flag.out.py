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
    # TODO(apexlite migrate): amp.initialize (opt_level O1) runs the forward passes in float16 and sets
    #     up loss scaling for its optimizer, but migrate tied no amp.scale_loss to it, so it cannot tell
    #     where the forward pass is nor where the loss is scaled, if it is (code migrate does not
    #     rewrite may call amp.scale_loss): removing it would drop mixed precision. By hand: put the
    #     forward pass and the loss under `with torch.autocast(device_type="cpu", dtype=torch.float16,
    #     enabled=amp is not None):`; if the loss is scaled, scale it with a
    #     `torch.amp.GradScaler("cpu")` instead: `scaler.scale(loss).backward()`,
    #     `scaler.step(optimizer)`, `scaler.update()`, and `scaler.state_dict()` in checkpoints; then
    #     delete amp.initialize and the apex import
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
loss = model(torch.randn(2, 2)).sum()
loss.backward()
optimizer.step()
