"""Programs for test_torchscript.py, and its scripting check, run in a fresh process:

    python -m tests.amp.o1.torchscript_programs

torch.jit.script caches what it compiles per process (the function, and every torch function it calls),
so a check that scripts under O1 must be the first to script these functions: it runs in a child.
It scripts a function and a model passed to amp.initialize under O1, then the same code again without
O1, and asserts that both compile to the same program with the same results; prints "ok" at the end.
"""
from __future__ import annotations

import io
import types

import torch
import torch.nn.functional as F


def mixed_ops(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    hidden = F.linear(x, w) + torch.mm(x, w.t()) + x.matmul(w.t())
    joined = torch.cat([hidden, torch.exp(hidden)], dim=0)
    normed = F.layer_norm(joined, (joined.shape[-1],))
    return F.softmax(normed, dim=-1).sum(0) + torch.stack([normed, normed]).sum()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(6, 5)
        self.second = torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(self.first(x))
        return F.log_softmax(self.second(hidden), dim=-1)


def make_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def fresh(function: types.FunctionType) -> types.FunctionType:
    """A new function object with the same code (torch.jit.script's cache is keyed by the object)."""
    return types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                              function.__closure__)


def assert_bitwise(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype is expected.dtype, (got.dtype, expected.dtype)
    assert torch.equal(got, expected)


def round_trip(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


def main() -> None:
    from apexlite import amp

    x, w = torch.randn(4, 6), torch.randn(6, 6)
    model = make_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    try:
        scripted_function = torch.jit.script(fresh(mixed_ops))
        scripted_model = torch.jit.script(model)
        assert torch.mm(x, w).dtype is torch.float16 and model(x).dtype is torch.float32  # O1 still casts
        assert model.first(x).dtype is torch.float16
        assert model._forward_pre_hooks and model._forward_hooks  # the model keeps its O1 hooks
        under_o1 = (scripted_function(x, w), scripted_model(x), round_trip(scripted_model)(x))
    finally:
        amp.deinitialize()
    plain_function = torch.jit.script(fresh(mixed_ops))
    assert scripted_function.code == plain_function.code
    assert scripted_model.code == torch.jit.script(make_net()).code
    assert_bitwise(under_o1[0], mixed_ops(x, w))
    assert_bitwise(under_o1[1], make_net()(x))
    assert_bitwise(under_o1[2], make_net()(x))
    assert_bitwise(plain_function(x, w), mixed_ops(x, w))
    print("ok")


if __name__ == "__main__":
    main()
