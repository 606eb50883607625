import torch

# Distillation: the teacher is not passed to amp.initialize, but apex's O1 patched torch's functions, so
# the teacher's forward ran in float16 too. Its output feeds the scaled loss: after the migration it runs
# under autocast with the student's; the teacher's evaluation outside the step gets the float32 note.
torch.manual_seed(0)
teacher = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
teacher.eval()
student = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")
for step in range(4):
    x = torch.randn(16, 8)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        with torch.no_grad():
            soft = teacher(x)
        logits = student(x)
        loss = torch.nn.functional.mse_loss(logits.float(), soft.float())
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    with torch.no_grad():
        # apexlite migrate: `teacher(...)` here runs in float32 now (apex's O1 ran every forward in low
        #     precision); for that, run it under `with torch.autocast(device_type="cpu",
        #     dtype=torch.float16):`
        again = teacher(x)
    print(step, float(loss), soft.dtype, again.dtype)
