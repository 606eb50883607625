"""`syncbn` (apexlite.compat.syncbn) against torch's batch norm: the kernels of apex's SyncBatchNorm run
as apex's SyncBatchNorm ran them over a batch split between "processes" (per-part statistics merged with
welford_parallel, the two gradient sums added as an all_reduce would) give torch.nn.functional.batch_norm's
output and autograd gradients for the whole batch; channels-first and channels-last, with the fused
residual and ReLU, in fp32, fp16 and bf16."""
import pytest
import torch
import torch.nn.functional as F

from apexlite.compat import syncbn
from tests._helpers.tolerances import dtype_tols

CHANNELS = 5
EPS = 1e-5
PARTS = 3  # "processes", each with a part of the batch
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _data(dtype, channel_last):
    """(input parts, fp32 weight, fp32 bias, upstream-gradient parts); channels last: (N, H, W, C)."""
    shape = (2, 4, 3, CHANNELS) if channel_last else (2, CHANNELS, 4, 3)
    parts = [(torch.randn(shape) * 2 + 0.5).to(dtype) for _ in range(PARTS)]
    upstream = [torch.randn(shape).to(dtype) for _ in range(PARTS)]
    return parts, torch.rand(CHANNELS) + 0.5, torch.randn(CHANNELS), upstream


def _to_nchw(t, channel_last):
    return t.permute(0, 3, 1, 2) if channel_last else t


def _reference(parts, weight, bias, upstream, channel_last, residual=None, relu=False):
    """torch's training batch norm of the whole batch in fp32 (+ residual, ReLU): output and gradients."""
    x = torch.cat([_to_nchw(p, channel_last) for p in parts]).float().requires_grad_()
    w, b = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    z = None if residual is None else torch.cat([_to_nchw(r, channel_last) for r in residual]).float().requires_grad_()
    out = F.batch_norm(x, None, None, w, b, training=True, eps=EPS)
    if z is not None:
        out = out + z
    if relu:
        out = out.relu()
    out.backward(torch.cat([_to_nchw(u, channel_last) for u in upstream]).float())
    return out.detach(), x.grad, w.grad, b.grad, None if z is None else z.grad


def _sync_statistics(parts, channel_last):
    """Each part's welford_mean_var, merged as apex's SyncBatchNorm merged the all_gathered ones."""
    stats = [(syncbn.welford_mean_var_c_last if channel_last else syncbn.welford_mean_var)(p) for p in parts]
    counts = torch.tensor([p.numel() // CHANNELS for p in parts], dtype=torch.int32)
    mean, var, inv_std = syncbn.welford_parallel(torch.stack([s[0] for s in stats]),
                                                 torch.stack([s[1] for s in stats]), counts, EPS)
    return mean, var, inv_std, counts


def _joined(tensors, channel_last):
    return torch.cat([_to_nchw(t, channel_last) for t in tensors])


@pytest.mark.parametrize("channel_last", [False, True], ids=["channels_first", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d)[6:] for d in DTYPES])
def test_split_batch_through_the_kernels_equals_torchs_batch_norm(dtype, channel_last):
    parts, weight, bias, upstream = _data(dtype, channel_last)
    mean, var, inv_std, counts = _sync_statistics(parts, channel_last)
    assert mean.dtype is torch.float32 and mean.shape == (CHANNELS,)
    whole = _joined(parts, channel_last).float()
    torch.testing.assert_close(mean, whole.mean((0, 2, 3)))
    torch.testing.assert_close(var, whole.var((0, 2, 3), unbiased=True))
    torch.testing.assert_close(inv_std, torch.rsqrt(whole.var((0, 2, 3), unbiased=False) + EPS))

    if channel_last:
        outputs = [syncbn.batchnorm_forward_c_last(p, None, mean, inv_std, weight, bias, False) for p in parts]
        reduced = [syncbn.reduce_bn_c_last(u, p, mean, inv_std, weight) for u, p in zip(upstream, parts)]
    else:
        outputs = [syncbn.batchnorm_forward(p, mean, inv_std, weight, bias) for p in parts]
        reduced = [syncbn.reduce_bn(u, p, mean, inv_std, weight) for u, p in zip(upstream, parts)]
    sum_dy, sum_dy_xmu = (sum(r[index] for r in reduced) for index in (0, 1))  # the all_reduce
    backward = syncbn.batchnorm_backward_c_last if channel_last else syncbn.batchnorm_backward
    grad_inputs = [backward(u, p, mean, inv_std, weight, sum_dy, sum_dy_xmu, counts) for u, p in zip(upstream, parts)]

    out, grad_x, grad_w, grad_b, _ = _reference(parts, weight, bias, upstream, channel_last)
    tols = dtype_tols(dtype)
    assert all(o.dtype is dtype for o in outputs + grad_inputs)
    torch.testing.assert_close(_joined(outputs, channel_last).float(), out.to(dtype).float(), **tols)
    torch.testing.assert_close(_joined(grad_inputs, channel_last).float(), grad_x.to(dtype).float(), **tols)
    grad_weight = sum(r[2] for r in reduced)
    grad_bias = sum(r[3] for r in reduced)
    assert grad_weight.dtype is torch.float32 and sum_dy.dtype is torch.float32
    torch.testing.assert_close(grad_weight, grad_w, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad_bias, grad_b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_channels_last_residual_and_fused_relu_with_its_backward(dtype):
    parts, weight, bias, upstream = _data(dtype, True)
    residual = [torch.randn_like(p.float()).to(dtype) for p in parts]
    mean, _, inv_std, counts = _sync_statistics(parts, True)
    outputs = [syncbn.batchnorm_forward_c_last(p, z, mean, inv_std, weight, bias, True) for p, z in zip(parts, residual)]
    through_relu = [syncbn.relu_bw_c_last(u, p, z, mean, inv_std, weight, bias)
                    for u, p, z in zip(upstream, parts, residual)]
    reduced = [syncbn.reduce_bn_c_last(g, p, mean, inv_std, weight) for g, p in zip(through_relu, parts)]
    sum_dy, sum_dy_xmu = (sum(r[index] for r in reduced) for index in (0, 1))
    grad_inputs = [syncbn.batchnorm_backward_c_last(g, p, mean, inv_std, weight, sum_dy, sum_dy_xmu, counts)
                   for g, p in zip(through_relu, parts)]

    out, grad_x, _, _, grad_z = _reference(parts, weight, bias, upstream, True, residual=residual, relu=True)
    tols = dtype_tols(dtype)
    torch.testing.assert_close(_joined(outputs, True).float(), out.to(dtype).float(), **tols)
    torch.testing.assert_close(_joined(through_relu, True).float(), grad_z.to(dtype).float(), **tols)
    torch.testing.assert_close(_joined(grad_inputs, True).float(), grad_x.to(dtype).float(), **tols)


def test_without_a_weight_the_gradients_are_empty_and_the_normalisation_plain():
    parts, _, _, upstream = _data(torch.float32, False)
    mean, var_biased = syncbn.welford_mean_var(parts[0])
    inv_std = torch.rsqrt(var_biased + EPS)
    out = syncbn.batchnorm_forward(parts[0], mean, inv_std, None, None)
    torch.testing.assert_close(out, F.batch_norm(parts[0], None, None, training=True, eps=EPS))
    sum_dy, sum_dy_xmu, grad_weight, grad_bias = syncbn.reduce_bn(upstream[0], parts[0], mean, inv_std, None)
    assert grad_weight.shape == (0,) and grad_bias.shape == (0,) and grad_weight.dtype is mean.dtype
    count = torch.tensor([parts[0].numel() // CHANNELS], dtype=torch.int32)
    grad_input = syncbn.batchnorm_backward(upstream[0], parts[0], mean, inv_std, None, sum_dy, sum_dy_xmu, count)
    x = parts[0].clone().requires_grad_()
    F.batch_norm(x, None, None, training=True, eps=EPS).backward(upstream[0])
    torch.testing.assert_close(grad_input, x.grad)


def test_welford_parallel_checks_its_shapes():
    with pytest.raises(ValueError, match="one count per process"):
        syncbn.welford_parallel(torch.zeros(2, 3), torch.ones(2, 3), torch.tensor([4]), EPS)
    with pytest.raises(ValueError, match="world_size, channels"):
        syncbn.welford_parallel(torch.zeros(3), torch.ones(3), torch.tensor([4]), EPS)
