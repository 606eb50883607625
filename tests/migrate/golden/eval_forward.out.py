import torch

# Training under amp, and an evaluation pass outside the training step: apex's O1 ran both in float16;
# after the migration only the training step is under autocast, and the evaluation says so. The forward
# under amp.disable_casts() ran in float32 under apex too: no note there.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward
#     pass and the loss and torch.amp.GradScaler (scaler)
scaler = torch.amp.GradScaler("cpu")


def evaluate(inputs):
    model.eval()
    with torch.no_grad():
        # apexlite migrate: `model(...)` here runs in float32 now (apex's O1 ran every forward in low
        #     precision); for that, run it under `with torch.autocast(device_type="cpu",
        #     dtype=torch.float16):`
        logits = model(inputs)
    model.train()
    return logits


for step in range(4):
    x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    with torch.autocast(device_type="cpu", enabled=False):
        reference = model(x)
    print(step, float(loss), evaluate(x).dtype, reference.dtype)
