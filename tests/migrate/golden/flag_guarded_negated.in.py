"""The scaled backward in the `else` of `if not fp16:`: the same flag as amp.initialize's `if fp16:`, so
the plain backward runs exactly when the GradScaler is disabled. A `try` that only tried apex goes."""
import torch

try:
    from apex import amp
except ImportError:
    amp = None


def main(fp16):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    loss = model(torch.randn(2, 2)).sum()
    if not fp16:
        loss.backward()
    else:
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
    optimizer.step()
