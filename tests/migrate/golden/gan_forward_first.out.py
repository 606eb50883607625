import torch

# The generator runs before the critic's first backward, which does not use its output; the critic's
# second loss and the generator's own loss do: that forward must run under autocast too (apex's O1
# cast it), though an earlier backward lies between it and those losses.
torch.manual_seed(0)
generator = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
critic = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1))
opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler_opt_c, scaler_opt_g)
scaler_opt_c = torch.amp.GradScaler("cpu")
scaler_opt_g = torch.amp.GradScaler("cpu")
criterion = torch.nn.BCEWithLogitsLoss()
real = torch.randn(16, 8)
for step in range(4):
    opt_c.zero_grad()
    noise = torch.randn(16, 8)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        fake = generator(noise)
        loss_real = criterion(critic(real), torch.ones(16, 1))
    scaler_opt_c.scale(loss_real).backward()
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss_fake = criterion(critic(fake.detach()), torch.zeros(16, 1))
    scaler_opt_c.scale(loss_fake).backward()
    scaler_opt_c.step(opt_c)
    scaler_opt_c.update()
    opt_g.zero_grad()
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss_g = criterion(critic(fake), torch.ones(16, 1))
    scaler_opt_g.scale(loss_g).backward()
    scaler_opt_g.step(opt_g)
    scaler_opt_g.update()
    print(step, float(loss_real + loss_fake), float(loss_g), fake.dtype)
