"""The loop of train_main.py, in its own module, as repositories split it."""
from apex import amp


def train(batches, model, criterion, optimizer):
    for step, (inputs, target) in enumerate(batches):
        output = model(inputs)
        loss = criterion(output, target)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
