"""FusedMixedPrecisionLamb against a Python LAMB, as apex's tests/L0/run_optimizers/test_lamb.py checked it,
plus its mixed-precision contract: fp32 masters, tensor lr/step, GradScaler unscale/skip, checkpoints."""
import warnings

import pytest
import torch

from apexlite.compat import apex_aliases
from apexlite.optimizers import FusedMixedPrecisionLamb
from tests._helpers.tolerances import dtype_tols

ITERS = 7  # apex's test: 7 iterations, 4 for bf16, 1 for fp16 (see test_reduced_precision_params)
MAX_GRAD_NORM = 1.0


class ReferenceLamb(torch.optim.Optimizer):
    """LAMB written out step by step (the algorithm apex's RefLAMB implements), in the params' dtype.

    Global grad-norm clipping at 1.0, Adam moments, bias correction, decoupled weight decay and the
    trust ratio ||p|| / ||update|| always applied (what use_nvlamb=True selects in the fused version).
    fp16 params keep fp32 moments here (squared and clipped fp16 grads underflow; apex's reference kept
    v in fp32 for one step and m in fp16, which leaves a few elements one fp16 rounding apart).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        global_norm = torch.stack([p.grad.float().norm() for p in params]).norm().item()
        clip = MAX_GRAD_NORM / max(global_norm, MAX_GRAD_NORM)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    moment_dtype = torch.float32 if p.dtype is torch.float16 else p.dtype
                    state.update(step=0, m=torch.zeros_like(p, dtype=moment_dtype),
                                 v=torch.zeros_like(p, dtype=moment_dtype))
                grad = p.grad.to(state["m"].dtype) * clip
                state["step"] += 1
                state["m"].mul_(beta1).add_(grad, alpha=1 - beta1)
                state["v"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = state["m"] / (1 - beta1 ** state["step"])
                v_hat = state["v"] / (1 - beta2 ** state["step"])
                update = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p
                w_norm, u_norm = p.float().norm(), update.float().norm()
                trust = (w_norm / u_norm).item() if w_norm > 0 and u_norm > 0 else 1.0
                p.add_(update, alpha=-group["lr"] * trust)


def _pair(tensors, options, reduced_dtype=None):
    ref = [torch.nn.Parameter(t.clone()) for t in tensors]
    tst = [torch.nn.Parameter(t.clone()) for t in tensors]
    ref_opt = ReferenceLamb(ref, **options)
    tst_opt = FusedMixedPrecisionLamb(tst, use_nvlamb=True, **options)
    if reduced_dtype is not None:
        tst_opt.reduced_precision_dtype = reduced_dtype  # set after construction, as apex's test does
    return ref, tst, ref_opt, tst_opt


def _same_grads(ref, tst):
    for p_ref, p_tst in zip(ref, tst):
        p_ref.grad = torch.rand_like(p_ref)
        p_tst.grad = p_ref.grad.clone()


APEX_OPTIONS = dict(lr=5e-4, betas=(0.9, 0.999), eps=1e-08)
CASES = {  # apex's test cases: (tensor sizes, options); multi_params sizes scaled down 64x for the CPU
    "float": ([[18011]], APEX_OPTIONS),
    "multi_params": ([[64, 16], [64], [64, 32], [505, 16], [1]], APEX_OPTIONS),
    "lamb_option": ([[1]], dict(lr=0.01, betas=(0.6, 0.9), eps=3e-06)),
}


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_reference_lamb_fp32(case, weight_decay):
    sizes, options = CASES[case]
    tensors = [torch.rand(size) for size in sizes]
    ref, tst, ref_opt, tst_opt = _pair(tensors, dict(options, weight_decay=weight_decay))
    for _ in range(ITERS):
        _same_grads(ref, tst)
        ref_opt.step()
        tst_opt.step()
        torch.testing.assert_close(tst, ref)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("dtype,iters", [(torch.bfloat16, 4), (torch.float16, 1)])
def test_reduced_precision_params(dtype, iters, weight_decay):
    """apex's test_bfloat16/test_half: the reference runs in the low dtype, the optimizer on fp32 masters.
    apex ran fp16 for one step only (its reference kept the fp32 second moment for that step alone)."""
    tensors = [torch.rand(18011, dtype=dtype)]
    ref, tst, ref_opt, tst_opt = _pair(tensors, dict(APEX_OPTIONS, weight_decay=weight_decay), reduced_dtype=dtype)
    for _ in range(iters):
        _same_grads(ref, tst)
        ref_opt.step()
        tst_opt.step()
        torch.testing.assert_close(tst, ref)
        assert tst[0].dtype is dtype


def test_bf16_params_follow_an_fp32_lamb_on_their_masters():
    """Masters are fp32: they equal an fp32 run fed the same (bf16) gradients; params are their rounding."""
    start = torch.randn(2000)
    half = torch.nn.Parameter(start.bfloat16())
    full = torch.nn.Parameter(start.bfloat16().float())
    opt_half = FusedMixedPrecisionLamb([half], lr=1e-2, reduced_precision_dtype=torch.bfloat16)
    opt_full = FusedMixedPrecisionLamb([full], lr=1e-2)
    for _ in range(10):
        grad = torch.randn(2000).bfloat16()
        half.grad, full.grad = grad.clone(), grad.float()
        opt_half.step()
        opt_full.step()
        master = opt_half.state[half]["master_param"]
        assert master.dtype is torch.float32 and opt_half.state[half]["exp_avg"].dtype is torch.float32
        torch.testing.assert_close(master, full.detach(), **dtype_tols(torch.float32))
        assert torch.equal(half.detach(), master.bfloat16())
    assert not torch.equal(full.detach().bfloat16().float(), full.detach())  # masters kept bits bf16 lacks


def _model_and_batch(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model, torch.randn(32, 8), torch.randn(32, 1)


def _loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def test_grad_scaler_unscales_inside_step_and_matches_unscaled_training():
    plain, x, y = _model_and_batch()
    scaled, _, _ = _model_and_batch()
    opt_plain = FusedMixedPrecisionLamb(plain.parameters(), lr=1e-2)
    opt_scaled = FusedMixedPrecisionLamb(scaled.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for _ in range(5):
        opt_plain.zero_grad()
        _loss(plain, x, y).backward()
        opt_plain.step()
        opt_scaled.zero_grad()
        scaler.scale(_loss(scaled, x, y)).backward()
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # torch's attribute contract, not the deprecated kwarg
            scaler.step(opt_scaled)
        scaler.update()
        for a, b in zip(scaled.parameters(), plain.parameters()):
            torch.testing.assert_close(a.grad, b.grad)  # .grad holds the unscaled gradient after step
            torch.testing.assert_close(a, b)
    assert opt_scaled.param_groups[0]["step"].item() == 5


def test_overflowing_step_changes_nothing():
    model, x, y = _model_and_batch()
    opt = FusedMixedPrecisionLamb(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(_loss(model, x, y)).backward()
    scaler.step(opt)
    scaler.update()
    params = [p.detach().clone() for p in model.parameters()]
    state = {k: v.clone() for k, v in opt.state[model[0].weight].items()}
    opt.zero_grad()
    scaler.scale(_loss(model, x, y)).backward()
    model[0].weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    assert all(torch.equal(opt.state[model[0].weight][k], v) for k, v in state.items())
    assert opt.param_groups[0]["step"].item() == 1
    assert scaler.get_scale() == 512.0


def test_apex_calling_form_with_grad_scaler_keyword():
    via_kwarg, x, y = _model_and_batch()
    via_scaler, _, _ = _model_and_batch()
    opts = [FusedMixedPrecisionLamb(m.parameters(), lr=1e-2) for m in (via_kwarg, via_scaler)]
    scalers = [torch.amp.GradScaler("cpu", init_scale=256.0) for _ in range(2)]
    for model, opt, scaler in zip((via_kwarg, via_scaler), opts, scalers):
        scaler.scale(_loss(model, x, y)).backward()
    opts[0].step(grad_scaler=scalers[0])
    scalers[1].step(opts[1])
    for a, b in zip(via_kwarg.parameters(), via_scaler.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        opts[0].step(scale=2.0)


def test_checkpoint_resume_continues_bit_for_bit():
    def run(steps, resume_at=None):
        torch.manual_seed(3)
        param = torch.nn.Parameter(torch.randn(300).bfloat16())
        opt = FusedMixedPrecisionLamb([param], lr=5e-3, reduced_precision_dtype=torch.bfloat16)
        for index in range(steps):
            if index == resume_at:
                saved_param, saved_opt = param.detach().clone(), opt.state_dict()
                param = torch.nn.Parameter(saved_param)
                opt = FusedMixedPrecisionLamb([param], lr=1.0, reduced_precision_dtype=torch.bfloat16)
                opt.load_state_dict(saved_opt)
            param.grad = torch.randn(300).bfloat16()
            opt.step()
        return param.detach(), opt

    straight, _ = run(8)
    resumed, opt = run(8, resume_at=4)
    assert torch.equal(straight, resumed)
    assert opt.state[opt.param_groups[0]["params"][0]]["master_param"].dtype is torch.float32
    assert opt.param_groups[0]["lr"].item() == pytest.approx(5e-3)


def test_tensor_hyperparameters_per_group_and_lr_schedulers():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = FusedMixedPrecisionLamb([a], lr=0.1, step=10)
    opt.add_param_group({"params": [b]})
    lrs = [group["lr"] for group in opt.param_groups]
    assert all(isinstance(lr, torch.Tensor) and lr.dtype is torch.float32 for lr in lrs)
    assert lrs[0] is not lrs[1] and opt.param_groups[1]["step"].tolist() == [10]
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    a.grad, b.grad = torch.ones(3), torch.ones(3)
    opt.step()
    scheduler.step()
    assert [float(g["lr"]) for g in opt.param_groups] == pytest.approx([0.05, 0.05])
    assert opt.param_groups[0]["step"].tolist() == [11]


def test_apex_import_path_and_validation():
    with apex_aliases():
        from apex.optimizers import FusedMixedPrecisionLamb as legacy

    assert legacy is FusedMixedPrecisionLamb
    params = [torch.nn.Parameter(torch.ones(2))]
    with pytest.raises(RuntimeError, match="FusedLAMB does not support the AMSGrad variant."):
        FusedMixedPrecisionLamb(params, amsgrad=True)
    with pytest.raises(ValueError, match="reduced_precision_dtype must be"):
        FusedMixedPrecisionLamb(params, reduced_precision_dtype=torch.float64)
