"""amp_C ops and multi_tensor_applier against plain torch arithmetic."""
import math

import torch

from apexlite.compat import amp_C
from apexlite.compat.apex.multi_tensor_apply import MultiTensorApply, multi_tensor_applier


def _flag():
    return torch.zeros(1, dtype=torch.int32)


def test_applier_is_available_with_apex_chunk_size():
    assert MultiTensorApply.available is True
    assert multi_tensor_applier.chunk_size == 65536


def test_multi_tensor_scale_writes_out_dtype_and_flags_inf():
    ins = [torch.randn(7), torch.randn(3, 3)]
    outs = [torch.empty(7, dtype=torch.float16), torch.empty(3, 3)]
    flag = _flag()
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [ins, outs], 0.25)
    assert outs[0].dtype is torch.float16
    torch.testing.assert_close(outs[0], (ins[0] * 0.25).half())
    torch.testing.assert_close(outs[1], ins[1] * 0.25)
    assert flag.item() == 0
    ins[1][1, 1] = float("inf")
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [ins, outs], 2.0)
    assert flag.item() == 1
    torch.testing.assert_close(outs[0], (ins[0] * 2.0).half())  # still computed, as apex does


def test_multi_tensor_axpby_checks_only_requested_argument():
    xs, ys = [torch.randn(5)], [torch.randn(5)]
    outs = [torch.empty(5)]
    flag = _flag()
    ys[0][0] = float("nan")
    multi_tensor_applier(amp_C.multi_tensor_axpby, flag, [xs, ys, outs], 2.0, 0.5, 0)
    assert flag.item() == 0  # only x is checked
    torch.testing.assert_close(outs[0][1:], (2.0 * xs[0] + 0.5 * ys[0])[1:])
    multi_tensor_applier(amp_C.multi_tensor_axpby, flag, [xs, ys, outs], 2.0, 0.5, -1)
    assert flag.item() == 1


def test_multi_tensor_l2norm_total_and_per_tensor():
    tensors = [torch.randn(10), torch.randn(4, 4).half()]
    norm, per_tensor = multi_tensor_applier(amp_C.multi_tensor_l2norm, _flag(), [tensors], True)
    expected = [t.float().norm() for t in tensors]
    torch.testing.assert_close(per_tensor, torch.stack(expected))
    assert norm.shape == (1,) and norm.dtype is torch.float32
    assert math.isclose(norm.item(), math.sqrt(sum(e.item() ** 2 for e in expected)), rel_tol=1e-6)
    _, empty = multi_tensor_applier(amp_C.multi_tensor_l2norm, _flag(), [tensors], False)
    assert empty.numel() == 0


def test_size_mismatch_is_reported():
    import pytest

    with pytest.raises(ValueError, match="size mismatch"):
        multi_tensor_applier(amp_C.multi_tensor_scale, _flag(), [[torch.ones(3)], [torch.ones(4)]], 1.0)


def test_l2norm_mp_equals_l2norm_for_every_input_dtype():
    tensors = [torch.randn(10), torch.randn(4, 4).half(), torch.randn(3).bfloat16()]
    total, per_tensor = amp_C.multi_tensor_l2norm_mp(65536, _flag(), [tensors], True)
    expected_total, expected_per_tensor = amp_C.multi_tensor_l2norm(65536, _flag(), [tensors], True)
    assert torch.equal(total, expected_total) and torch.equal(per_tensor, expected_per_tensor)


def test_l2norm_scale_writes_scaled_copies_and_returns_norms_of_the_inputs():
    ins = [torch.randn(6), torch.randn(2, 5)]
    outs = [torch.empty(6, dtype=torch.float16), torch.empty(2, 5)]
    flag = _flag()
    total, per_tensor = multi_tensor_applier(amp_C.multi_tensor_l2norm_scale, flag, [ins, outs], 0.5, True)
    torch.testing.assert_close(outs[0], (ins[0] * 0.5).half())
    torch.testing.assert_close(outs[1], ins[1] * 0.5)
    torch.testing.assert_close(per_tensor, torch.stack([t.norm() for t in ins]))
    torch.testing.assert_close(total, torch.cat([t.reshape(-1) for t in ins]).norm().reshape(1))
    assert flag.item() == 0
    ins[0][2] = float("nan")
    _, empty = amp_C.multi_tensor_l2norm_scale(65536, flag, [ins, outs], 0.5, False)
    assert flag.item() == 1 and empty.numel() == 0
