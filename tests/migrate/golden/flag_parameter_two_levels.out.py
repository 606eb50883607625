"""A flag passed down two levels (`train(..., fp16=args.fp16)` calls `train_batch(..., fp16)`) guarding scale_loss,
with amp.initialize under the same flag: every call on the way passes amp.initialize's flag, so the migration is
exact on both paths."""
import argparse
import torch


# apexlite migrate: train_batch() takes the GradScaler that replaced amp (`scaler=`); every call
#     migrate saw passes it
def train_batch(model, optimizer, x, y, fp16, *, scaler):
    with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=scaler.is_enabled()):
        loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    if fp16:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


# apexlite migrate: train() takes the GradScaler that replaced amp (`scaler=`); every call migrate
#     saw passes it
def train(model, optimizer, data, fp16, *, scaler):
    for x, y in data:
        loss = train_batch(model, optimizer, x, y, fp16, scaler=scaler)
    return loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # apexlite migrate: amp.initialize (opt_level O1) ran only when `args.fp16`: it became
    #     torch.autocast(float16) around the forward pass and the loss and torch.amp.GradScaler
    #     (scaler), on every path, enabled by that flag
    scaler = torch.amp.GradScaler("cpu", enabled=args.fp16)
    data = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(4)]
    print(train(model, optimizer, data, fp16=args.fp16, scaler=scaler).item())


if __name__ == "__main__":
    main()
