"""SyncBatchNorm mapping onto torch's, and batchnorm kept fp32 under O2 (single process: torch's
SyncBatchNorm only synchronises statistics on GPU/XPU backends, so its training-mode sync is not
exercised on this CPU-only machine)."""
from __future__ import annotations

import copy

import pytest
import torch

from apexlite import amp
from apexlite.parallel import SyncBatchNorm, convert_syncbn_model
from tests._helpers.tolerances import dtype_tols


def _convnet() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Conv2d(4, 2, 1))


def test_convert_keeps_stats_and_params_and_o2_keeps_it_fp32():
    model = _convnet()
    model(torch.randn(4, 3, 6, 6))  # populate running stats
    model.eval()
    reference = copy.deepcopy(model)
    converted = convert_syncbn_model(model)
    bn = converted[1]
    assert type(bn) is torch.nn.SyncBatchNorm
    for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(bn, name), getattr(reference[1], name)), name
    x = torch.randn(2, 3, 6, 6)
    expected = reference(x)
    converted = amp.initialize(converted, opt_level="O2", verbosity=0)
    try:
        assert converted[0].weight.dtype is torch.float16
        assert bn.weight.dtype is torch.float32 and bn.running_var.dtype is torch.float32
        with torch.no_grad():
            torch.testing.assert_close(converted(x), expected, **dtype_tols(torch.float16))
    finally:
        amp.deinitialize()


def test_legacy_constructor_and_refused_channel_last():
    bn = SyncBatchNorm(5, eps=1e-3, momentum=0.2)
    assert isinstance(bn, torch.nn.SyncBatchNorm) and bn.eps == 1e-3 and bn.momentum == 0.2
    with pytest.raises(ValueError, match="channel_last"):
        SyncBatchNorm(5, channel_last=True)
    with pytest.raises(ValueError, match="channel_last"):
        convert_syncbn_model(_convnet(), channel_last=True)
