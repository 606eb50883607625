"""apex.parallel pieces that need no process group: LARC, convert_syncbn_model, DDP argument checks, the flat
buffer helpers and SyncBatchnormFunction in one process."""
import pytest
import torch

import apexlite.parallel as apexlite_parallel
from apexlite.compat.apex import parallel


def test_larc_rescales_gradients_like_the_reference():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4, 3))
    g = torch.randn(4, 3)
    lr, wd, tc = 0.1, 0.01, 0.02
    opt = parallel.LARC(torch.optim.SGD([p], lr=lr, weight_decay=wd), trust_coefficient=tc)
    expected = p.detach().clone()
    ratio = tc * expected.norm() / (g.norm() + expected.norm() * wd + 1e-8)
    ratio = min(ratio / lr, 1.0)
    expected = expected - lr * (g + wd * expected) * ratio
    p.grad = g.clone()
    opt.step()
    torch.testing.assert_close(p.detach(), expected)
    assert opt.param_groups[0]["weight_decay"] == wd  # restored after the step


def test_larc_works_with_amp_initialize_and_scale_loss():
    from apexlite.compat.apex import amp

    model = torch.nn.Linear(3, 1)
    opt = parallel.LARC(torch.optim.SGD(model.parameters(), lr=0.1))
    try:
        model, opt = amp.initialize(model, opt, opt_level="O1", loss_scale=128.0, verbosity=0)
        before = model.weight.detach().clone()
        with amp.scale_loss(model(torch.randn(4, 3)).sum(), opt) as scaled:
            scaled.backward()
        opt.step()
        assert not torch.equal(before, model.weight)
    finally:
        amp.deinitialize()


def test_convert_syncbn_model_keeps_weights_and_shares_stats():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.InstanceNorm2d(4))
    with torch.no_grad():
        model[1].weight.uniform_()
    bn = model[1]
    converted = parallel.convert_syncbn_model(model)
    assert isinstance(converted[1], parallel.SyncBatchNorm)
    assert isinstance(converted[1], torch.nn.SyncBatchNorm)
    assert not isinstance(converted[2], torch.nn.SyncBatchNorm)
    assert converted[1].running_mean is bn.running_mean
    torch.testing.assert_close(converted[1].weight, bn.weight)
    x = torch.randn(2, 3, 6, 6)
    converted.eval()
    reference = torch.nn.functional.batch_norm(model[0](x), bn.running_mean, bn.running_var, bn.weight, bn.bias)
    torch.testing.assert_close(converted[1](model[0](x)), reference)


def test_sync_batchnorm_channel_last_and_residual():
    with pytest.raises(AttributeError, match="channels_last"):
        parallel.SyncBatchNorm(4, channel_last=True)
    bn = parallel.SyncBatchNorm(4, fuse_relu=True).eval()
    x, z = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    plain = torch.nn.functional.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias)
    torch.testing.assert_close(bn(x, z), torch.relu(plain + z))


def test_ddp_argument_errors_match_apex():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="shared_param is no longer supported"):
        parallel.DistributedDataParallel(model, shared_param=True)
    with pytest.raises(ValueError, match="only be used if delay_allreduce=False"):
        parallel.DistributedDataParallel(model, delay_allreduce=True, num_allreduce_streams=2)
    for factor in (0, -2.0, "4"):  # apex divided by 0 (ZeroDivisionError); a 0 here made every grad NaN
        with pytest.raises(ValueError, match="gradient_predivide_factor must be a number > 0"):
            parallel.DistributedDataParallel(model, gradient_predivide_factor=factor)
    with pytest.raises(RuntimeError, match="init_process_group"):
        parallel.DistributedDataParallel(model)


def test_multiproc_launcher_names_torchrun():
    from apexlite.compat import ApexliteUnsupportedError
    from apexlite.compat.apex.parallel import multiproc

    with pytest.raises(ApexliteUnsupportedError, match="torchrun"):
        multiproc.main()


def test_flatten_helpers_round_trip_and_group_by_type():
    from apexlite.compat.apex.parallel import distributed

    tensors = [torch.ones(2, 3), torch.arange(4.0, dtype=torch.float64), torch.zeros(5).half(), torch.ones(1)]
    flat = distributed.flatten([tensors[0], tensors[3]])
    assert flat.shape == (7,)
    for original, view in zip([tensors[0], tensors[3]], distributed.unflatten(flat, [tensors[0], tensors[3]])):
        assert torch.equal(original, view)
    by_type = distributed.split_by_type(tensors)
    assert list(by_type) == ["torch.FloatTensor", "torch.DoubleTensor", "torch.HalfTensor"]
    assert by_type["torch.FloatTensor"][0] is tensors[0] and by_type["torch.FloatTensor"][1] is tensors[3]
    assert [[t.dtype for t in bucket] for bucket in distributed.split_half_float_double(tensors)] == [
        [torch.float16], [torch.float32, torch.float32], [torch.float64]]
    found = []
    distributed.extract_tensors([tensors[0], (3, {"k"}, [tensors[1]]), "text"], found)
    assert found[0] is tensors[0] and found[1] is tensors[1] and len(found) == 2
    distributed.import_flatten_impl()
    assert distributed.imported_flatten_impl is True


def test_apply_flat_dist_call_copies_the_collectives_result_back():
    from apexlite.compat.apex.parallel import distributed

    bucket = [torch.ones(2), torch.full((3,), 2.0)]
    distributed.apply_flat_dist_call(bucket, lambda flat, factor: flat.mul_(factor), (3.0,))
    torch.testing.assert_close(bucket[0], torch.full((2,), 3.0))
    torch.testing.assert_close(bucket[1], torch.full((3,), 6.0))


@pytest.mark.parametrize("affine", [True, False])
def test_sync_batchnorm_function_matches_batch_norm_in_one_process(affine):
    from apexlite.compat.apex.parallel.sync_batchnorm_kernel import SyncBatchnormFunction

    x = torch.randn(6, 4, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(4, dtype=torch.float64, requires_grad=True) if affine else None
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True) if affine else None
    upstream = torch.randn(6, 4, 5, dtype=torch.float64)
    mean, var = x.detach().mean((0, 2)), x.detach().var((0, 2), unbiased=False)
    out = SyncBatchnormFunction.apply(x, weight, bias, mean, var, 1e-5, None, 1)
    grads = torch.autograd.grad((out * upstream).sum(), [x] + ([weight, bias] if affine else []))
    ref = torch.nn.functional.batch_norm(x, None, None, weight, bias, training=True, eps=1e-5)
    ref_grads = torch.autograd.grad((ref * upstream).sum(), [x] + ([weight, bias] if affine else []))
    torch.testing.assert_close(out, ref)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad)


@pytest.mark.parametrize("convert", [parallel.convert_syncbn_model, apexlite_parallel.convert_syncbn_model],
                         ids=["apex.parallel", "apexlite.parallel"])
def test_convert_syncbn_model_of_no_model_says_what_it_takes(convert):
    with pytest.raises(TypeError, match="takes the model .*got NoneType"):
        convert(None)
