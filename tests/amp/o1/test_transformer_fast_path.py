"""torch's fused transformer inference path under O1 (apexlite/amp/o1/transformer_fast_path.py).

In eval mode under no_grad, nn.TransformerEncoder(Layer) and nn.MultiheadAttention may run one fused kernel,
which torch skips under torch.autocast; under O1 it met a bf16 activation beside fp32 weights and raised.
The reference is the module path: the same model in training mode (dropout 0) under O1, which computes the same
thing op by op, and the fp32 model within low-precision tolerance.
"""
import pytest
import torch

from apexlite import amp

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts


def encoder():
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))


def attention():
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.project = torch.nn.Linear(8, 16)
            self.attention = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            h = self.project(x)
            return self.attention(h, h, h, need_weights=False)[0]

    return Attention()


MODELS = {"TransformerEncoder": encoder, "TransformerEncoderLayer": lambda: torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)),
    "MultiheadAttention": attention}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_eval_under_no_grad_runs_the_module_path(build, dtype):
    model = build()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        fp32 = model.eval()(x)
    amp.initialize(model, opt_level="O1", dtype=dtype, verbosity=0)
    try:
        with torch.no_grad():
            module_path = model.train()(x)
            evaluated = model.eval()(x)
    finally:
        amp.deinitialize()
    assert torch.equal(evaluated, module_path)
    torch.testing.assert_close(evaluated.float(), fp32, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("before", [True, False])
def test_the_switch_is_restored_to_what_it_was(before):
    torch.backends.mha.set_fastpath_enabled(before)
    try:
        amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
        off_during = not torch.backends.mha.get_fastpath_enabled()
        amp.deinitialize()
        assert off_during and torch.backends.mha.get_fastpath_enabled() is before
        amp.initialize(torch.nn.Linear(2, 2), opt_level="O2", verbosity=0)
        assert torch.backends.mha.get_fastpath_enabled() is before  # only O1 patches torch
        amp.deinitialize()
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
