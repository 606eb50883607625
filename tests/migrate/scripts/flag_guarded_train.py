"""A speech-model-style training loop where mixed precision is a switch: amp only with --fp16-run.

The shape of NVIDIA's own training scripts (written afresh here): `amp.initialize` inside `if fp16_run:`,
the scaled backward and the clipping of amp's master params under the same test, a plain fp32 path in
the `else` branches, and one optimizer step for both. Prints one loss line per step.
"""
import argparse
import math

import torch


def build_model(hidden):
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


def batches(steps, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        inputs = torch.randn(32, 8, generator=generator)
        yield inputs, inputs.sum(dim=1, keepdim=True).sin()


def train(hparams):
    torch.manual_seed(hparams.seed)
    model = build_model(hparams.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=hparams.learning_rate)

    if hparams.fp16_run:
        from apex import amp
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

    overflowed = False
    for step, (inputs, targets) in enumerate(batches(hparams.steps, hparams.seed)):
        model.zero_grad()
        prediction = model(inputs)
        loss = torch.nn.functional.mse_loss(prediction, targets)
        if hparams.fp16_run:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()

        if hparams.fp16_run:
            grad_norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), hparams.grad_clip)
            overflowed = math.isinf(grad_norm) or math.isnan(grad_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hparams.grad_clip)

        optimizer.step()
        if not overflowed:
            print(f"step {step} loss {loss.item():.6f} grad_norm {float(grad_norm):.4f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16-run", type=int, default=0, help="1: train in mixed precision")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    train(parser.parse_args())
