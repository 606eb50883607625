"""scale_loss under a different flag than amp.initialize, with a plain backward in the `else`: one
GradScaler enabled by args.fp16 would step the gradients of the unscaled branch."""
import torch
from apex import amp


def main(args):
    model = torch.nn.Linear(2, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for _ in range(3):
        loss = model(torch.randn(2, 2).cuda()).sum()
        if args.scale_losses:
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
        else:
            loss.backward()
        optimizer.step()
