"""The apex package's own names, apex._autocast_utils and apex.contrib.clip_grad."""
import logging
import warnings

import pytest
import torch

from apexlite.compat import apex as compat_apex
from apexlite.compat.apex._autocast_utils import _cast_if_autocast_enabled
from apexlite.compat.apex.contrib.clip_grad import clip_grad_norm_


def test_rank_info_formatter_and_handler_format_with_the_rank():
    record = logging.LogRecord("apex", logging.INFO, "train.py", 7, "hello", None, None)
    text = compat_apex.handler.formatter.format(record)
    assert "rank:0 - train.py:7 - INFO - hello" in text
    assert compat_apex.handler not in logging.getLogger("apex").handlers  # apexlite leaves apex's logger alone


def test_check_cudnn_version_and_warn():
    available = torch.backends.cudnn.is_available()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert compat_apex.check_cudnn_version_and_warn("--fast_bottleneck", 10**9) is False
        if available:
            assert compat_apex.check_cudnn_version_and_warn("--fast_bottleneck", 0) is True
    assert "`--fast_bottleneck` needs cuDNN 1000000000 or later" in str(caught[0].message)


def test_deprecated_warning_is_a_future_warning_of_apexs_category():
    with pytest.warns(compat_apex.DeprecatedFeatureWarning, match="going away"):
        compat_apex.deprecated_warning("going away")
    assert issubclass(compat_apex.DeprecatedFeatureWarning, FutureWarning)


def test_cast_if_autocast_enabled_follows_the_autocast_region():
    x, ints, double = torch.ones(2), torch.arange(2), torch.ones(2, dtype=torch.float64)
    assert _cast_if_autocast_enabled(x, 3)[0] is x
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast_x, (cast_ints, cast_double), number = _cast_if_autocast_enabled(x, [ints, double], 3)
    assert cast_x.dtype == torch.bfloat16 and cast_ints is ints and cast_double is double and number == 3


def _params_with_grads(seed):
    generator = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(3, 4, generator=generator)) for _ in range(3)]
    for param in params[:2]:
        param.grad = torch.randn(param.shape, generator=generator) * 10
    return params


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_contrib_clip_grad_norm_matches_torch(norm_type):
    ours, reference = _params_with_grads(0), _params_with_grads(0)
    total = clip_grad_norm_(ours, 1.0, norm_type=norm_type)
    expected = torch.nn.utils.clip_grad_norm_(reference[:2], 1.0, norm_type=norm_type)
    torch.testing.assert_close(total, expected)
    for mine, theirs in zip(ours[:2], reference[:2]):
        torch.testing.assert_close(mine.grad, theirs.grad)
    assert ours[2].grad is None


def test_contrib_clip_grad_norm_edge_cases():
    assert torch.equal(clip_grad_norm_([torch.nn.Parameter(torch.ones(2))], 1.0), torch.tensor(0.0))
    single = _params_with_grads(1)[0]
    clip_grad_norm_(single, 0.5)
    torch.testing.assert_close(single.grad.norm(), torch.tensor(0.5), rtol=1e-4, atol=1e-6)
    bad = _params_with_grads(2)
    bad[0].grad[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(bad, 1.0, error_if_nonfinite=True)
