"""A flag passed down two levels (`train(..., fp16=args.fp16)` calls `train_batch(..., fp16)`) guarding scale_loss,
with amp.initialize under the same flag: every call on the way passes amp.initialize's flag, so the migration is
exact on both paths."""
import argparse
import torch
from apex import amp


def train_batch(model, optimizer, x, y, fp16):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    if fp16:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()
    optimizer.step()
    return loss


def train(model, optimizer, data, fp16):
    for x, y in data:
        loss = train_batch(model, optimizer, x, y, fp16)
    return loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    data = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(4)]
    print(train(model, optimizer, data, fp16=args.fp16).item())


if __name__ == "__main__":
    main()
