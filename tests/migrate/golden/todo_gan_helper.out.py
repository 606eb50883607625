import torch
from apex import amp

def backward(loss, optimizer):
    # TODO(apexlite migrate): this scale_loss's optimizer cannot be tied to amp.initialize's: migrate
    #     follows the names amp.initialize assigns, the parameters of functions whose every call it sees
    #     pass the same one of them (a function handed on as a value hides its calls; a helper called
    #     with a generator's and a discriminator's optimizer gets two), and imports of them. Reach the
    #     optimizer one of those ways, or pass a torch.amp.GradScaler in beside it and write
    #     `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()

G = torch.nn.Linear(4, 4)
D = torch.nn.Linear(4, 1)
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
[G, D], [opt_g, opt_d] = amp.initialize([G, D], [opt_g, opt_d], opt_level="O1", num_losses=2)
for step in range(3):
    z = torch.randn(8, 4)
    d_loss = D(G(z).detach()).mean()
    opt_d.zero_grad()
    backward(d_loss, opt_d)
    opt_d.step()
    g_loss = -D(G(z)).mean()
    opt_g.zero_grad()
    backward(g_loss, opt_g)
    opt_g.step()
print(float(g_loss))
