import torch
from apex import amp

# Training under amp, and an evaluation pass outside the training step: apex's O1 ran both in float16;
# after the migration only the training step is under autocast, and the evaluation says so. The forward
# under amp.disable_casts() ran in float32 under apex too: no note there.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")


def evaluate(inputs):
    model.eval()
    with torch.no_grad():
        logits = model(inputs)
    model.train()
    return logits


for step in range(4):
    x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    with amp.disable_casts():
        reference = model(x)
    print(step, float(loss), evaluate(x).dtype, reference.dtype)
