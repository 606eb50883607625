"""O2 with FusedAdam's fused master step against the separate-masters O2 path and an fp32 reference.

Both paths run the same FusedAdam kernel; the fused path feeds it the scaled half grads and lets it
unscale, update the fp32 master and write the half copy, so masters and model params must agree
bit for bit with the path that materialises unscaled fp32 master grads first.
"""
from dataclasses import dataclass, field
from typing import Optional, Tuple

import pytest
import torch

from apexlite import amp
from apexlite.amp.fused_master import FusedMasterGrads
from apexlite.amp.master import MasterParams
from apexlite.amp.session import current_session
from apexlite.optimizers import FusedAdam

LOW = [torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _teardown():
    yield
    amp.deinitialize()


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 3))


@dataclass
class Recipe:
    """One training scenario, run once per path."""

    steps: int = 8
    poison: Tuple[int, ...] = ()          # steps whose input holds an inf (the step must be skipped)
    backward_passes: int = 1              # scale_loss blocks per step
    num_losses: int = 1                   # >1: pass i uses loss_id i
    delay_unscale: bool = False           # every block but the last delays the unscale
    clip: Optional[float] = None          # clip_grad_norm_(amp.master_params(opt), clip)
    scale_window: Optional[int] = None    # dynamic scale growth every N clean exits
    idle: Tuple[int, ...] = ()            # steps the last layer gets no grads (frozen for the step)
    edit_fp32_grads: bool = False         # an L1 penalty added to the fp32 batchnorm weight's grad after scale_loss
    kept_masters: Optional[float] = None  # clip a list of amp.master_params(opt) taken at the first step
    extra: dict = field(default_factory=dict)


def run(recipe: Recipe, low: torch.dtype, fused: bool, implementation: str = "auto"):
    torch.manual_seed(0)
    model = mlp()
    opt = FusedAdam(model.parameters(), lr=1e-2, weight_decay=0.01, implementation=implementation)
    opt.amp_fused_master_step = fused
    model, opt = amp.initialize(model, opt, opt_level="O2", dtype=low, loss_scale="dynamic", verbosity=0,
                                num_losses=recipe.num_losses, **recipe.extra)
    session = current_session()
    if recipe.scale_window:
        for scaler in session.loss_scalers:
            scaler._scale_seq_len = recipe.scale_window
    scales, skipped = [], []
    for step in range(recipe.steps):
        before = [p.detach().clone() for p in model.parameters()]
        model[3].requires_grad_(step not in recipe.idle)
        for index in range(recipe.backward_passes):
            x = torch.randn(8, 4)
            if step in recipe.poison and index == recipe.backward_passes - 1:
                x[0, 0] = float("inf")
            loss = model(x.to(low)).float().pow(2).mean()
            delay = recipe.delay_unscale and index < recipe.backward_passes - 1
            loss_id = index % recipe.num_losses
            with amp.scale_loss(loss, opt, loss_id=loss_id, delay_unscale=delay) as scaled:
                scaled.backward()
        if recipe.clip is not None:
            torch.nn.utils.clip_grad_norm_(amp.master_params(opt), recipe.clip)
        if recipe.edit_fp32_grads:  # network slimming: apex had unscaled the fp32 params' grads in place
            model[1].weight.grad.add_(0.1 * torch.sign(model[1].weight.detach()))
        if recipe.kept_masters is not None:
            kept = list(amp.master_params(opt)) if step == 0 else kept
            torch.nn.utils.clip_grad_norm_(kept, recipe.kept_masters)
        opt.step()
        opt.zero_grad()
        skipped.append(all(torch.equal(a, b) for a, b in zip(before, model.parameters())))
        scales.append([s.loss_scale() for s in session.loss_scalers])
    out = dict(params=[p.detach().clone() for p in model.parameters()],
               masters=[m.detach().clone() for m in amp.master_params(opt)],
               scales=scales, skipped=skipped, strategy=type(session.amp_optimizer(opt).grads),
               buffers=[b.clone() for b in model.buffers()], grad_scale_left=hasattr(opt, "grad_scale"),
               counts=[float(state["step"]) for state in opt.state.values() if "step" in state])
    amp.deinitialize()
    return out


RECIPES = {
    "plain": Recipe(),
    "overflow-first-and-middle": Recipe(poison=(0, 4)),
    "scale-growth": Recipe(scale_window=2, steps=9),
    "two-backwards": Recipe(backward_passes=2),
    "two-losses-growth": Recipe(backward_passes=2, num_losses=2, scale_window=3, poison=(2,)),
    "delay-unscale": Recipe(backward_passes=3, delay_unscale=True),
    "clip": Recipe(clip=0.05),
    "clip-overflow": Recipe(clip=0.05, poison=(3,)),
    # apex's step count: the idle layer's counters advance with the group, not on the skipped step
    "idle-layer-overflow": Recipe(idle=(1, 2, 5), poison=(4,)),
    "fp32-grads-edited": Recipe(edit_fp32_grads=True, poison=(3,)),
    "master-list-kept-across-steps": Recipe(kept_masters=0.05, poison=(3,)),
}


@pytest.mark.parametrize("implementation", ["auto", "reference"])  # compiled kernel (when built), pure torch
@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("name", list(RECIPES))
def test_fused_step_matches_separate_masters(name, low, implementation):
    recipe = RECIPES[name]
    fused = run(recipe, low, fused=True, implementation=implementation)
    separate = run(recipe, low, fused=False, implementation=implementation)
    assert fused["strategy"] is FusedMasterGrads and separate["strategy"] is MasterParams
    assert fused["scales"] == separate["scales"] and fused["skipped"] == separate["skipped"]
    # poisoned steps are skipped; fast scale growth may add real fp16 overflows
    assert set(recipe.poison) <= {i for i, s in enumerate(fused["skipped"]) if s}
    assert not fused["grad_scale_left"]
    assert fused["counts"] == separate["counts"] == [recipe.steps - sum(fused["skipped"])] * len(fused["counts"])
    for a, b in zip(fused["masters"], separate["masters"]):
        assert torch.equal(a, b)
    for a, b in zip(fused["params"], separate["params"]):
        assert torch.equal(a, b)
    for a, b in zip(fused["buffers"], separate["buffers"]):  # an inf input leaves NaN running stats
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("low", LOW, ids=str)
def test_fused_o2_tracks_fp32_adamw(low):
    # no batchnorm right after a Linear here: it zeroes that bias's true gradient, and Adam turns
    # the remaining rounding noise into full-size steps of random sign in any precision
    def net():
        return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.BatchNorm1d(16),
                                   torch.nn.Linear(16, 3))

    torch.manual_seed(0)
    model, reference = net(), net()
    reference.load_state_dict(model.state_dict())
    opt = FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.01)
    model, opt = amp.initialize(model, opt, opt_level="O2", dtype=low, verbosity=0)
    for _ in range(8):
        x = torch.randn(8, 4)
        with amp.scale_loss(model(x.to(low)).float().pow(2).mean(), opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()
        reference(x).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    tols = {torch.float16: dict(rtol=5e-3, atol=5e-3), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}[low]
    masters = list(amp.master_params(opt))
    for master, ref in zip(masters, reference.parameters()):
        torch.testing.assert_close(master, ref.detach(), **tols)
    for param, master in zip(model.parameters(), masters):
        assert torch.equal(param, master.to(param.dtype))


def test_no_fp32_grad_copies_and_scaled_half_grads_until_the_step():
    torch.manual_seed(0)
    model = mlp()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    # the groups keep the model's own params; fp16 ones get an fp32 master in the optimizer state
    assert [p for g in opt.param_groups for p in g["params"]] == list(model.parameters())
    halves = [p for p in model.parameters() if p.dtype is torch.float16]
    assert halves and all(opt.state[p]["master_param"].dtype is torch.float32 for p in halves)
    x = torch.randn(8, 4).half()
    with amp.scale_loss(model(x).float().pow(2).mean(), opt) as scaled:
        scaled.backward()
    scale = amp.state_dict()["loss_scaler0"]["loss_scale"]
    unscaled = {p: p.grad.float() / scale for p in halves}
    assert all(opt.state[p]["master_param"].grad is None for p in halves)
    assert not hasattr(opt, "grad_scale")
    opt.step()
    assert not hasattr(opt, "grad_scale")
    # what the kernel consumed: the half grads divided by the scale they carry
    assert all(unscaled[p].abs().max() < 10 for p in halves)


def test_overflow_leaves_masters_moments_and_params_bit_identical():
    torch.manual_seed(0)
    model = mlp()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    for poisoned in (False, True):
        x = torch.randn(8, 4).half()
        if poisoned:
            x[3, 1] = float("inf")
        before = {k: v.clone() for k, v in model.state_dict().items()}
        state_before = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
        with amp.scale_loss(model(x).float().pow(2).mean(), opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()
    for key, value in model.state_dict().items():
        if key.startswith("1.running") or key.endswith("num_batches_tracked"):
            continue  # batchnorm statistics move in the forward pass, as in fp32 training
        assert torch.equal(value, before[key]), key
    for param, state in opt.state.items():
        for key, value in state.items():
            assert torch.equal(value, state_before[id(param)][key]), key
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 2.0 ** 15


def _batch(step: int, low: torch.dtype) -> torch.Tensor:
    return torch.randn(8, 4, generator=torch.Generator().manual_seed(1000 + step)).to(low)


def _train_o2(fused: bool, low: torch.dtype, steps: range, ckpt: Optional[dict] = None) -> dict:
    torch.manual_seed(0)
    model = mlp()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    opt.amp_fused_master_step = fused
    model, opt = amp.initialize(model, opt, opt_level="O2", dtype=low, loss_scale="dynamic", verbosity=0)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        amp.load_state_dict(ckpt["amp"])
    for step in steps:
        with amp.scale_loss(model(_batch(step, low)).float().pow(2).mean(), opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()
    out = dict(model=model.state_dict(), opt=opt.state_dict(), amp=amp.state_dict(),
               masters=[m.detach().clone() for m in amp.master_params(opt)])
    amp.deinitialize()
    return out


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("writer_fused,reader_fused", [(True, True), (True, False), (False, True)])
def test_checkpoint_resumes_bit_identically_across_paths(low, writer_fused, reader_fused):
    uninterrupted = _train_o2(True, low, range(5))
    ckpt = _train_o2(writer_fused, low, range(3))
    resumed = _train_o2(reader_fused, low, range(3, 5), ckpt=ckpt)
    assert resumed["amp"] == uninterrupted["amp"]
    for a, b in zip(resumed["masters"], uninterrupted["masters"]):
        assert torch.equal(a, b)
    for key, value in uninterrupted["model"].items():
        assert torch.equal(resumed["model"][key], value), key


def test_opt_out_and_deinitialize_leave_a_working_optimizer():
    model = mlp()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    with amp.scale_loss(model(torch.randn(8, 4).half()).float().pow(2).mean(), opt) as scaled:
        scaled.backward()
    amp.deinitialize()
    assert not hasattr(opt, "grad_scale")
    assert opt.zero_grad.__func__ is FusedAdam.zero_grad
    assert opt.load_state_dict.__func__ is FusedAdam.load_state_dict


def test_half_param_group_added_after_initialize_gets_a_master_and_trains():
    torch.manual_seed(0)
    model = mlp()
    head = torch.nn.Linear(3, 2)
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    head.half()
    opt.add_param_group({"params": head.parameters()})
    reference_head = [p.detach().float().clone() for p in head.parameters()]
    with amp.scale_loss(head(model(torch.randn(8, 4).half()).half()).float().pow(2).mean(), opt) as scaled:
        scaled.backward()
    opt.step()
    for param, before in zip(head.parameters(), reference_head):
        master = opt.state[param]["master_param"]
        assert master.dtype is torch.float32 and not torch.equal(master, before)
        assert torch.equal(param, master.half())


def test_fused_o2_step_leaves_the_model_grads_scaled_as_apex_did():
    """No extra write pass: the kernel unscales in registers; `.grad` keeps the scaled fp16 values."""
    torch.manual_seed(0)
    model = mlp()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", loss_scale=128.0, verbosity=0)
    try:
        with amp.scale_loss(model(torch.randn(8, 4).half()).float().pow(2).mean(), opt) as scaled:
            scaled.backward()
        halves = [p for p in model.parameters() if p.dtype is torch.float16]
        before = [p.grad.clone() for p in halves]
        opt.step()
        assert all(torch.equal(p.grad, g) for p, g in zip(halves, before))
        assert "leave_grads_scaled" not in vars(opt) and "grad_scale" not in vars(opt)
    finally:
        amp.deinitialize()


def test_accumulating_steps_leave_the_flat_buffers_alone_until_a_plain_step(caplog):
    """O2 with two backward passes per step puts fp32 grads on the masters, which no flat buffer takes: those
    steps run per tensor without rebuilding the buffers (it rebuilt at every step and, after a few, gave the
    buffers up for the rest of the run); the first plain step after them rebuilds once."""
    torch.manual_seed(0)
    model = mlp()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", dtype=torch.bfloat16, verbosity=0)
    rebuilds = []
    with caplog.at_level("DEBUG", logger="apexlite.optimizers"):
        for backward_passes in [2] * 8 + [1] * 3:
            caplog.clear()
            for _ in range(backward_passes):
                with amp.scale_loss(model(torch.randn(8, 4, dtype=torch.bfloat16)).float().pow(2).mean(), opt) as s:
                    s.backward()
            opt.step()
            opt.zero_grad()
            rebuilds.append(sum("flat buffers" in record.getMessage() for record in caplog.records))
    assert rebuilds == [0] * 8 + [1, 0, 0]


@pytest.mark.parametrize("fused", [True, False])
def test_a_backward_outside_scale_loss_is_refused_at_the_step_on_both_o2_paths(fused):
    """The separate-masters path found no master grads and refused; the fused path divided the unscaled grads by
    the last loss scale. Both refuse now, before anything changes, and a scaled backward then steps as usual."""
    torch.manual_seed(0)
    model = mlp()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    opt.amp_fused_master_step = fused
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    loss = model(torch.randn(8, 4).half()).float().pow(2).mean()
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.step()
    opt.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(8, 4).half()).float().pow(2).mean().backward()
    with pytest.raises(amp.AmpUsageError, match="scale_loss"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad()
    with amp.scale_loss(model(torch.randn(8, 4).half()).float().pow(2).mean(), opt) as scaled:
        scaled.backward()
    opt.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
