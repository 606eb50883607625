"""nn.RNN/GRU/LSTM with fp32 weights fed a low-precision input under O1, as in CRNN/speech models where
a Linear/Conv output (low precision under O1) feeds an LSTM. torch's `RNNBase.check_input` refused
the dtype mismatch before the O1 kernels were reached; apex returned low-precision outputs.
The reference is a hand-cast copy of the module run on the same low-precision input.
"""
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from apexlite import amp

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

RNNS = [
    (torch.nn.RNN, dict(nonlinearity="relu")), (torch.nn.RNN, dict(nonlinearity="tanh", num_layers=2)),
    (torch.nn.GRU, dict(num_layers=2, bidirectional=True)), (torch.nn.LSTM, {}),
    (torch.nn.LSTM, dict(num_layers=2)), (torch.nn.LSTM, dict(num_layers=2, bidirectional=True)),
]
DTYPES = [torch.float16, torch.bfloat16]


def reference_copy(rnn, dtype):
    copy = type(rnn)(rnn.input_size, rnn.hidden_size, num_layers=rnn.num_layers, bidirectional=rnn.bidirectional,
                     **({"nonlinearity": rnn.nonlinearity} if isinstance(rnn, torch.nn.RNN) else {}))
    copy.load_state_dict(rnn.state_dict())
    return copy.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cls,kwargs", RNNS, ids=lambda v: str(v))
def test_low_precision_input_gives_low_precision_output_equal_to_a_cast_copy(cls, kwargs, dtype):
    rnn = cls(4, 5, **kwargs)
    expected, _ = reference_copy(rnn, dtype)(torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(1)).to(dtype))
    x = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
    amp.initialize(rnn, opt_level="O1", dtype=dtype, verbosity=0)
    try:
        out, _ = rnn(x)
        out.float().sum().backward()
    finally:
        amp.deinitialize()
    assert out.dtype is dtype and torch.equal(out, expected)
    assert x.grad.dtype is dtype and rnn.weight_ih_l0.grad.dtype is torch.float32


def test_an_fp16_linear_output_feeds_an_lstm_in_a_crnn_style_model():
    class Crnn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features = torch.nn.Linear(8, 6)
            self.lstm = torch.nn.LSTM(6, 5, batch_first=True)
            self.head = torch.nn.Linear(5, 3)

        def forward(self, x):
            out, _ = self.lstm(self.features(x))
            return self.head(out[:, -1])

    torch.manual_seed(0)
    model = Crnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    try:
        x = torch.randn(4, 7, 8)
        out = model(x)
        assert out.dtype is torch.float16
        with amp.scale_loss(out.float().pow(2).mean(), opt) as scaled:
            scaled.backward()
        opt.step()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_packed_low_precision_sequence(dtype):
    rnn = torch.nn.RNN(4, 5, num_layers=2)
    lengths = torch.tensor([5, 3, 2])
    data = torch.randn(5, 3, 4).to(dtype)
    expected, _ = reference_copy(rnn, dtype)(pack_padded_sequence(data, lengths))
    amp.initialize(rnn, opt_level="O1", dtype=dtype, verbosity=0)
    try:
        out, _ = rnn(pack_padded_sequence(data.clone().requires_grad_(), lengths))
    finally:
        amp.deinitialize()
    assert out.data.dtype is dtype and torch.equal(out.data, expected.data)


def test_outside_o1_the_dtype_check_is_torchs_again():
    rnn = torch.nn.LSTM(4, 5)
    amp.initialize(rnn, opt_level="O1", verbosity=0)
    amp.deinitialize()
    with pytest.raises((ValueError, RuntimeError), match="dtype|type"):
        rnn(torch.randn(3, 2, 4).half())


def test_wrong_input_size_is_still_reported_under_o1():
    rnn = torch.nn.LSTM(4, 5)
    amp.initialize(rnn, opt_level="O1", verbosity=0)
    try:
        with pytest.raises(RuntimeError, match="input.size\\(-1\\) must be equal to input_size"):
            rnn(torch.randn(3, 2, 7).half())
    finally:
        amp.deinitialize()
