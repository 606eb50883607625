"""apex.parallel pieces that need no process group: LARC, convert_syncbn_model, DDP argument checks."""
import pytest
import torch

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
    with pytest.raises(RuntimeError, match="init_process_group"):
        parallel.DistributedDataParallel(model)


def test_multiproc_launcher_names_torchrun():
    from apexlite.compat import ApexliteUnsupportedError
    from apexlite.compat.apex.parallel import multiproc

    with pytest.raises(ApexliteUnsupportedError, match="torchrun"):
        multiproc.main()
