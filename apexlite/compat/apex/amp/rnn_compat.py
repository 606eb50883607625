"""`apex.amp.rnn_compat`: apex's RNN shims. torch has had no pre-1.1 RNN backend for years, and apexlite's
O1 casts torch.nn RNNs itself, so the patching helpers come from the table as placeholders."""
from __future__ import annotations

import torch

from apexlite.compat import generic

RNN_NAMES = ["rnn_relu", "rnn_tanh", "gru", "lstm"]


def has_old_rnns() -> bool:
    """Whether torch still has the pre-1.1 THNN RNN backend (torch.nn.backends.thnn): never on torch >= 1.1."""
    backends = getattr(torch.nn, "backends", None)
    return hasattr(getattr(getattr(backends, "thnn", None), "backend", None), "LSTMCell")


__getattr__ = generic.fallback_getattr(__name__)
