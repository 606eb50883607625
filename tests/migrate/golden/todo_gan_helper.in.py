import torch
from apex import amp

def backward(loss, optimizer):
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
