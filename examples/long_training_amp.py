"""A long legacy apex.amp training run (90 epochs x 2000 steps: hours on a CPU), on built-in synthetic data.

Written the way apex-era language-model scripts were: a small transformer encoder, torch.optim.AdamW
with its default eps, the loss printed every --print-freq steps, a checkpoint at the end. Nothing in
it knows about sweeps or step budgets. Compare opt levels on it without editing it:

    python -m apexlite sweep examples/long_training_amp.py --max-steps 20
    APEXLITE_MAX_STEPS=50 python -m apexlite run examples/long_training_amp.py --opt-level O2

The task: predict each token's successor in sequences that follow a fixed random permutation of the
vocabulary, so the loss falls steadily from log(vocab).
"""
import argparse
import time

import torch
import torch.nn as nn

from apex import amp
from apex.fp16_utils import to_python_float


def parse():
    parser = argparse.ArgumentParser(description="transformer language model with apex.amp (synthetic data)")
    parser.add_argument("--opt-level", default="O1")
    parser.add_argument("--epochs", default=90, type=int)
    parser.add_argument("--steps-per-epoch", default=2000, type=int)
    parser.add_argument("--batch-size", default=16, type=int)
    parser.add_argument("--seq-len", default=32, type=int)
    parser.add_argument("--lr", default=3e-3, type=float)
    parser.add_argument("--print-freq", default=100, type=int)
    parser.add_argument("--checkpoint", default=None, help="save model/optimizer/amp state here at the end")
    return parser.parse_args()


VOCAB, D_MODEL, HEADS, LAYERS = 128, 64, 4, 2


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


def synthetic_batches(steps, batch_size, seq_len, seed):
    """Sequences walking a fixed permutation of the vocabulary; the target is the next token."""
    successor = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        tokens = torch.empty(batch_size, seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, VOCAB, (batch_size,), generator=gen)
        for position in range(1, seq_len + 1):
            tokens[:, position] = successor[tokens[:, position - 1]]
        yield tokens[:, :-1], tokens[:, 1:]


def main():
    args = parse()
    torch.manual_seed(0)
    model = TinyLM()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for inputs, targets in synthetic_batches(args.steps_per_epoch, args.batch_size, args.seq_len, seed=epoch):
            start = time.time()
            logits = model(inputs)
            loss = criterion(logits.float().flatten(0, 1), targets.flatten())
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            if step % args.print_freq == 0:
                print("epoch {} step {} loss {:.4f} loss_scale {} time {:.3f}s".format(
                    epoch, step, to_python_float(loss), amp._amp_state.loss_scalers[0].loss_scale(),
                    time.time() - start))
            step += 1

    if args.checkpoint:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()},
                   args.checkpoint)


if __name__ == "__main__":
    main()
