import torch
from apex import amp

# Distillation: the teacher is not passed to amp.initialize, but apex's O1 patched torch's functions, so
# the teacher's forward ran in float16 too. Its output feeds the scaled loss: after the migration it runs
# under autocast with the student's; the teacher's evaluation outside the step gets the float32 note.
torch.manual_seed(0)
teacher = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
teacher.eval()
student = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
student, optimizer = amp.initialize(student, optimizer, opt_level="O1")
for step in range(4):
    x = torch.randn(16, 8)
    with torch.no_grad():
        soft = teacher(x)
    logits = student(x)
    loss = torch.nn.functional.mse_loss(logits.float(), soft.float())
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    with torch.no_grad():
        again = teacher(x)
    print(step, float(loss), soft.dtype, again.dtype)
