"""fairseq's FusedAdam probe and v1 step, written the way fairseq wrote them against apex (2019-23).

`get_fused_adam_class()` imports `fused_adam_cuda` by name and chooses the v1 optimizer when that works;
the step then calls `fused_adam_cuda.adam` per parameter (fp32 master copy, fp32 moments, the grad, the
model's own tensor as the output copy). Run as `python fairseq_fused_adam.py [--install]`; prints one
JSON line: the class chosen, the module that answered, and the largest difference after three steps
from torch.optim.Adam run on the same gradients.
"""
import importlib
import json
import sys

import torch

if "--install" in sys.argv:
    import apexlite

    apexlite.install()

fused_adam_cuda = None


def get_fused_adam_class():
    try:
        global fused_adam_cuda
        fused_adam_cuda = importlib.import_module("fused_adam_cuda")
        return FusedAdamV1
    except ImportError:
        return None


class FusedAdamV1(torch.optim.Optimizer):

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, eps_inside_sqrt=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=True))
        self.eps_mode = 0 if eps_inside_sqrt else 1

    @torch.no_grad()
    def step(self, scale=1.0):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                p_data_fp32 = p.data.float()
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p_data_fp32)
                    state["exp_avg_sq"] = torch.zeros_like(p_data_fp32)
                state["step"] += 1
                fused_adam_cuda.adam(p_data_fp32, p.data, state["exp_avg"], state["exp_avg_sq"], p.grad.data,
                                     group["lr"], beta1, beta2, group["eps"], scale, state["step"], self.eps_mode,
                                     1 if group["bias_correction"] else 0, group["weight_decay"])


def main():
    optimizer_class = get_fused_adam_class()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    reference = torch.nn.Linear(8, 4)
    reference.load_state_dict(model.state_dict())
    optimizer = optimizer_class(model.parameters(), lr=1e-2)
    torch_adam = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for _ in range(3):
        x = torch.randn(5, 8)
        for net, opt in ((model, optimizer), (reference, torch_adam)):
            net.zero_grad()
            net(x).square().sum().backward()
            opt.step()
    difference = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), reference.parameters()))
    print(json.dumps({"class": optimizer_class.__name__, "module": fused_adam_cuda.__name__,
                      "difference": difference}))


if __name__ == "__main__":
    main()
