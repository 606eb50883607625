"""`apex.RNN`: the old RNN factories, removed from apex together with amp; use torch.nn instead.

apex's own `apex.RNN` stopped importing on torch 1.x (it needs `torch.nn._functions.rnn`), so no
modern setup ran it. apexlite keeps the names importable as placeholder classes that raise, with the
torch.nn replacement, when called.
"""
from apexlite.compat._unsupported import unsupported_class

_ADVICE = ("Use torch.nn.{} (it takes the same input_size, hidden_size, num_layers, bias, batch_first, "
           "dropout and bidirectional arguments); O1 casts its weights for you.")

LSTM = unsupported_class("apex.RNN.LSTM", _ADVICE.format("LSTM"))
GRU = unsupported_class("apex.RNN.GRU", _ADVICE.format("GRU"))
ReLU = unsupported_class("apex.RNN.ReLU", _ADVICE.format("RNN(nonlinearity='relu')"))
Tanh = unsupported_class("apex.RNN.Tanh", _ADVICE.format("RNN(nonlinearity='tanh')"))
mLSTM = unsupported_class("apex.RNN.mLSTM", "There is no torch.nn multiplicative LSTM; write the cell as an "
                          "nn.Module (see torch.nn.LSTMCell for the structure).")

__all__ = ["LSTM", "GRU", "ReLU", "Tanh", "mLSTM"]
