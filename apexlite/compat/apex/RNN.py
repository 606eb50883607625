"""`apex.RNN`: the old RNN factories, removed from apex together with amp; use torch.nn instead."""
from apexlite.compat._unsupported import unsupported

_ADVICE = ("Use torch.nn.{} (it takes the same input_size, hidden_size, num_layers, bias, batch_first, "
           "dropout and bidirectional arguments); O1 casts its weights for you.")

LSTM = unsupported("apex.RNN.LSTM", _ADVICE.format("LSTM"))
GRU = unsupported("apex.RNN.GRU", _ADVICE.format("GRU"))
ReLU = unsupported("apex.RNN.ReLU", _ADVICE.format("RNN(nonlinearity='relu')"))
Tanh = unsupported("apex.RNN.Tanh", _ADVICE.format("RNN(nonlinearity='tanh')"))
mLSTM = unsupported("apex.RNN.mLSTM", "There is no torch.nn multiplicative LSTM; write the cell as an "
                    "nn.Module (see torch.nn.LSTMCell for the structure).")
