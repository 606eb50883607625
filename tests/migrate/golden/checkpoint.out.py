import torch

model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")
checkpoint = torch.load("resume.pt")
model.load_state_dict(checkpoint["model"])
optimizer.load_state_dict(checkpoint["optimizer"])
# apexlite migrate: checkpoints written before the migration hold apex's scaler state
#     ({'loss_scaler0': {'loss_scale', 'unskipped'}}): such a state is read into GradScaler's form
#     here (its scale and growth tracker), one written since is loaded as it is
scaler.load_state_dict(checkpoint["amp"] if "scale" in checkpoint["amp"] else {**scaler.state_dict(), "scale": checkpoint["amp"]["loss_scaler0"]["loss_scale"], "_growth_tracker": checkpoint["amp"]["loss_scaler0"]["unskipped"]})
for _ in range(3):
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = model(torch.randn(2, 4)).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": scaler.state_dict()}, "resume.pt")
