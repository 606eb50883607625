"""A tiny BERT-style classifier fine-tuned the way 2019 scripts did it (pytorch-pretrained-bert's
examples/run_classifier.py): with --fp16, `model.half()`, `apex.optimizers.FusedAdam(...,
bias_correction=False, max_grad_norm=1.0)` wrapped in `apex.optimizers.FP16_Optimizer`,
`optimizer.backward(loss)` and the warmup written into `param_group['lr']`; without it, fp32 with a
BertAdam-style optimizer. Prints the per-step losses as JSON.

Unlike the real BertAdam, this one clips each param group's gradient norm (as apex's FusedAdam does),
so the fp16 and fp32 runs follow one update rule and can be compared step by step.
"""
import argparse
import json
import math

import torch
from torch import nn

VOCAB, HIDDEN, SEQ, LABELS = 40, 32, 12, 2


class TinyBert(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.position_embeddings = nn.Embedding(SEQ, HIDDEN)
        self.LayerNorm = nn.LayerNorm(HIDDEN)
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.attention_output = nn.Linear(HIDDEN, HIDDEN)
        self.attention_LayerNorm = nn.LayerNorm(HIDDEN)
        self.intermediate = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.output = nn.Linear(4 * HIDDEN, HIDDEN)
        self.output_LayerNorm = nn.LayerNorm(HIDDEN)
        self.pooler = nn.Linear(HIDDEN, HIDDEN)
        self.classifier = nn.Linear(HIDDEN, LABELS)

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        scores = self.query(hidden) @ self.key(hidden).transpose(1, 2) / math.sqrt(HIDDEN)
        context = torch.softmax(scores, dim=-1) @ self.value(hidden)
        hidden = self.attention_LayerNorm(hidden + self.attention_output(context))
        hidden = self.output_LayerNorm(hidden + self.output(torch.nn.functional.gelu(self.intermediate(hidden))))
        return self.classifier(torch.tanh(self.pooler(hidden[:, 0])))


def batches(steps, batch_size, seed):
    """Sentences of random tokens; the label says whether token 7 occurs more often than token 3."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        input_ids = torch.randint(0, VOCAB, (batch_size, SEQ), generator=gen)
        labels = ((input_ids == 7).sum(1) > (input_ids == 3).sum(1)).long()
        yield input_ids, labels


def warmup_linear(x, warmup=0.002):
    if x < warmup:
        return x / warmup
    return 1.0 - x


class BertAdam(torch.optim.Optimizer):
    """Adam without bias correction, decoupled weight decay, warmup, group-norm clipping (fp32 path)."""

    def __init__(self, params, lr, warmup, t_total, b1=0.9, b2=0.999, e=1e-8, max_grad_norm=1.0):
        super().__init__(params, dict(lr=lr, warmup=warmup, t_total=t_total, b1=b1, b2=b2, e=e, weight_decay=0.0,
                                      max_grad_norm=max_grad_norm))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            norm = torch.stack([p.grad.norm() for p in params]).norm()
            clip = max(1.0, (float(norm) + 1e-6) / group["max_grad_norm"])
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"], state["next_m"], state["next_v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                g = p.grad / clip
                state["next_m"].mul_(group["b1"]).add_(g, alpha=1 - group["b1"])
                state["next_v"].mul_(group["b2"]).addcmul_(g, g, value=1 - group["b2"])
                update = state["next_m"] / (state["next_v"].sqrt() + group["e"]) + group["weight_decay"] * p
                progress = state["step"] / group["t_total"]
                p.add_(update, alpha=-group["lr"] * warmup_linear(progress, group["warmup"]))
                state["step"] += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--loss_scale", type=float, default=0)
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--warmup_proportion", type=float, default=0.1)
    parser.add_argument("--train_batch_size", type=int, default=32)
    parser.add_argument("--num_train_steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = TinyBert()
    if args.fp16:
        model.half()
    num_train_optimization_steps = args.num_train_steps

    param_optimizer = list(model.named_parameters())
    no_decay = ['bias', 'LayerNorm.bias', 'LayerNorm.weight']
    optimizer_grouped_parameters = [
        {'params': [p for n, p in param_optimizer if not any(nd in n for nd in no_decay)], 'weight_decay': 0.01},
        {'params': [p for n, p in param_optimizer if any(nd in n for nd in no_decay)], 'weight_decay': 0.0}
    ]
    if args.fp16:
        try:
            from apex.optimizers import FP16_Optimizer
            from apex.optimizers import FusedAdam
        except ImportError:
            raise ImportError("Please install apex from https://www.github.com/nvidia/apex to use distributed and "
                              "fp16 training.")

        optimizer = FusedAdam(optimizer_grouped_parameters,
                              lr=args.learning_rate,
                              bias_correction=False,
                              max_grad_norm=1.0)
        if args.loss_scale == 0:
            optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
        else:
            optimizer = FP16_Optimizer(optimizer, static_loss_scale=args.loss_scale)
    else:
        optimizer = BertAdam(optimizer_grouped_parameters,
                             lr=args.learning_rate,
                             warmup=args.warmup_proportion,
                             t_total=num_train_optimization_steps)

    loss_fct = nn.CrossEntropyLoss()
    losses, global_step = [], 0
    for input_ids, label_ids in batches(num_train_optimization_steps, args.train_batch_size, args.seed):
        logits = model(input_ids)
        loss = loss_fct(logits.view(-1, LABELS), label_ids.view(-1))
        if args.fp16:
            optimizer.backward(loss)
        else:
            loss.backward()
        losses.append(loss.item())
        if args.fp16:
            # modify learning rate with special warm up BERT uses
            lr_this_step = args.learning_rate * warmup_linear(global_step / num_train_optimization_steps,
                                                              args.warmup_proportion)
            for param_group in optimizer.param_groups:
                param_group['lr'] = lr_this_step
        optimizer.step()
        optimizer.zero_grad()
        global_step += 1
    scale = optimizer.cur_scale if args.fp16 else None
    print(json.dumps({"losses": losses, "loss_scale": scale}))


if __name__ == "__main__":
    main()
