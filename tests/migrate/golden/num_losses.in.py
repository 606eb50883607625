"""Two optimizers, three losses: loss ids 0 and 1 meet in optimizer_a's gradients."""
import torch
import apex

torch.manual_seed(0)
net_a, net_b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
optimizer_a = torch.optim.SGD(net_a.parameters(), lr=0.1)
optimizer_b = torch.optim.SGD(net_b.parameters(), lr=0.1)
[net_a, net_b], [optimizer_a, optimizer_b] = apex.amp.initialize(
    [net_a, net_b], [optimizer_a, optimizer_b], opt_level="O1", num_losses=3)
for _ in range(3):
    features = net_a(torch.randn(2, 4))
    first = features.pow(2).mean()
    with apex.amp.scale_loss(first, optimizer_a, loss_id=0) as scaled:
        scaled.backward(retain_graph=True)
    second = features.abs().mean()
    with apex.amp.scale_loss(second, optimizer_a, loss_id=1) as scaled:
        scaled.backward()
    optimizer_a.step()
    third = net_b(torch.randn(2, 4)).mean()
    with apex.amp.scale_loss(third, [optimizer_b], loss_id=2) as scaled:
        scaled.backward()
    optimizer_b.step()
    print([s.loss_scale() for s in apex.amp._amp_state.loss_scalers])
