"""An O2 checkpoint restored before `amp.initialize` (a common order) never resumes silently wrong.

Reference: the same run uninterrupted. A torch optimizer's O2 checkpoint carries its fp32 masters in each
param group too, which torch's load_state_dict keeps: loaded before or after initialize, the resumed run
equals the uninterrupted one bit for bit; carried masters that do not fit are refused, naming the right
order. Masters carried in per-param state (FusedAdam's format) are restored at initialize as well.
"""
import copy

import pytest
import torch

from apexlite import amp
from apexlite.amp.checkpoint_convert import MASTERS_KEY, MASTERS_MARKER
from apexlite.amp.errors import AmpUsageError
from apexlite.optimizers import FusedAdam

# (name, optimizer factory): torch optimizers take the separate-masters O2 path
TORCH_OPTIMIZERS = [("adam", lambda params: torch.optim.Adam(params, lr=1e-2)),
                    ("sgd", lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _steps(model, optimizer, count, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        x, y = torch.randn(16, 6, generator=generator), torch.randn(16, 1, generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.half()).float(), y)
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()


def _checkpoint_and_reference(make_optimizer):
    model = _model()
    optimizer = make_optimizer(model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    try:
        _steps(model, optimizer, 3, seed=1)
        checkpoint = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                    "amp": amp.state_dict(),  # as torch.save would: no live tensors
                                    "master params": list(amp.master_params(optimizer))})
        _steps(model, optimizer, 4, seed=2)
        return checkpoint, [m.detach().clone() for m in amp.master_params(optimizer)]
    finally:
        amp.deinitialize()


def _resume(make_optimizer, checkpoint, load_before_initialize, opt_level="O2"):
    """A fresh run restored from `checkpoint` in the given order; returns (model, optimizer), initialized."""
    model = _model()
    model.load_state_dict(checkpoint["model"])
    optimizer = make_optimizer(model.parameters())
    if load_before_initialize:
        optimizer.load_state_dict(checkpoint["optimizer"])
    model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, verbosity=0)
    if not load_before_initialize:
        optimizer.load_state_dict(checkpoint["optimizer"])
    amp.load_state_dict(checkpoint["amp"])
    assert not any(MASTERS_MARKER in group for group in optimizer.param_groups)
    return model, optimizer


@pytest.mark.parametrize("load_before_initialize", [True, False], ids=["load-then-initialize", "initialize-then-load"])
@pytest.mark.parametrize("make_optimizer", [o[1] for o in TORCH_OPTIMIZERS], ids=[o[0] for o in TORCH_OPTIMIZERS])
def test_either_order_resumes_exactly_as_the_uninterrupted_run(make_optimizer, load_before_initialize):
    checkpoint, reference = _checkpoint_and_reference(make_optimizer)
    model, optimizer = _resume(make_optimizer, checkpoint, load_before_initialize)
    try:
        _steps(model, optimizer, 4, seed=2)
        for got, want in zip(amp.master_params(optimizer), reference):
            assert torch.equal(got, want)
    finally:
        amp.deinitialize()


def test_a_checkpoint_saved_once_holds_each_master_once():
    """The group entries are the MASTERS_KEY tensors themselves, so torch.save writes their storage once."""
    checkpoint, _ = _checkpoint_and_reference(TORCH_OPTIMIZERS[0][1])
    listed = {id(t) for t in checkpoint["optimizer"][MASTERS_KEY]}
    carried = [t for group in checkpoint["optimizer"]["param_groups"] for t in group[MASTERS_MARKER]]
    assert len(carried) == len(listed) and {id(t) for t in carried} == listed


@pytest.mark.parametrize("opt_level", ["O0", "O1", "O3"])
def test_levels_without_masters_take_the_carried_masters_as_a_load_after_initialize_does(opt_level):
    checkpoint, _ = _checkpoint_and_reference(TORCH_OPTIMIZERS[0][1])
    params = {}
    for before in (True, False):
        model, _ = _resume(TORCH_OPTIMIZERS[0][1], checkpoint, before, opt_level=opt_level)
        params[before] = [p.detach().clone() for p in model.parameters()]
        amp.deinitialize()
    assert all(torch.equal(a, b) for a, b in zip(params[True], params[False]))


@pytest.mark.parametrize("damage, reason", [
    (lambda group: group.__setitem__(MASTERS_MARKER, True), "holds no fp32 master weights"),
    (lambda group: group.__setitem__(MASTERS_MARKER, group[MASTERS_MARKER][:-1]), "do not match its params"),
])
def test_carried_masters_that_do_not_fit_are_refused_naming_the_order(damage, reason):
    checkpoint, _ = _checkpoint_and_reference(TORCH_OPTIMIZERS[0][1])
    model = _model()
    model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    optimizer.load_state_dict(checkpoint["optimizer"])
    damage(optimizer.param_groups[0])
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(AmpUsageError, match=reason + r".*amp.initialize\(model, optimizer, \.\.\.\) first"):
        amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))  # nothing changed
    assert MASTERS_MARKER in optimizer.param_groups[0]


def test_removing_the_marker_resumes_from_the_model_weights_as_the_message_says():
    checkpoint, _ = _checkpoint_and_reference(TORCH_OPTIMIZERS[0][1])
    model = _model()
    model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    optimizer.load_state_dict(checkpoint["optimizer"])
    for group in optimizer.param_groups:
        group.pop(MASTERS_MARKER, None)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    try:
        halves = [p for p in model.parameters()]
        for master, half in zip(amp.master_params(optimizer), halves):
            assert torch.equal(master, half.float())  # rebuilt from the model, as apex did
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("model_loaded", [True, False], ids=["with-its-model", "optimizer-only"])
def test_masters_in_per_param_state_survive_torch_load_and_are_restored_at_initialize(model_loaded, caplog):
    """Switching from FusedAdam to torch's Adam: FusedAdam's O2 checkpoint keeps `master_param` per param. With the
    model's weights from the same checkpoint they are restored exactly; without them (the model as built) the
    masters are rebuilt from the model's weights, as apex built them, with a warning saying to load them."""
    caplog.set_level("WARNING", logger="apexlite")
    model = _model()
    optimizer = FusedAdam(model.parameters(), lr=1e-2)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    try:
        _steps(model, optimizer, 3, seed=1)
        saved = copy.deepcopy(optimizer.state_dict())
        weights = copy.deepcopy(model.state_dict())
        masters = [m.detach().clone() for m in amp.master_params(optimizer)]
    finally:
        amp.deinitialize()
    assert any("master_param" in entry for entry in saved["state"].values())

    fresh = _model()
    if model_loaded:
        fresh.load_state_dict(weights)
    built = [p.detach().clone() for p in fresh.parameters()]
    adam = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    adam.load_state_dict(saved)  # before initialize: torch keeps per-param state, fp32 while the model is
    fresh, adam = amp.initialize(fresh, adam, opt_level="O2", verbosity=0)
    try:
        restored = list(amp.master_params(adam))
        for got, want, weight in zip(restored, masters, built):
            assert torch.equal(got, want if model_loaded else weight)
        for model_param, master in zip(fresh.parameters(), restored):
            assert torch.equal(model_param, master.half())  # the model holds its masters
        assert all("master_param" not in state for state in adam.state.values())
        assert ("or were not loaded" in caplog.text) == (not model_loaded)
    finally:
        amp.deinitialize()


OPTIMIZERS = TORCH_OPTIMIZERS + [("fused_adam", lambda params: FusedAdam(params, lr=1e-2))]


@pytest.mark.parametrize("make_optimizer", [o[1] for o in OPTIMIZERS], ids=[o[0] for o in OPTIMIZERS])
def test_nvidia_berts_resume_with_apexs_private_lazy_init_resumes_exactly(make_optimizer):
    """DeepLearningExamples' BERT: `optimizer._lazy_init_maybe_master_weights()`, `_amp_stash.lazy_init_called =
    True`, load the optimizer, then copy the saved `amp.master_params` back; the methods go at deinitialize."""
    checkpoint, reference = _checkpoint_and_reference(make_optimizer)
    model = _model()
    optimizer = make_optimizer(model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    try:
        model.load_state_dict(checkpoint["model"])
        optimizer._lazy_init_maybe_master_weights()
        optimizer._amp_stash.lazy_init_called = True
        optimizer.load_state_dict(checkpoint["optimizer"])
        for master, saved in zip(amp.master_params(optimizer), checkpoint["master params"]):
            master.data.copy_(saved.data)
        _steps(model, optimizer, 4, seed=2)
        for got, want in zip(amp.master_params(optimizer), reference):
            assert torch.equal(got, want)
    finally:
        amp.deinitialize()
    assert not hasattr(optimizer, "_lazy_init_maybe_master_weights") and not hasattr(optimizer, "_amp_lazy_init")


def _o3_run(make_optimizer, steps, state=None):
    """O3 in bfloat16 (fast on CPU): `steps` steps; with `state`, that optimizer state is loaded before initialize."""
    model = _model()
    if state is not None:
        model.load_state_dict(state["model"])
    optimizer = make_optimizer(model.parameters())
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    model, optimizer = amp.initialize(model, optimizer, opt_level="O3", cast_model_type=torch.bfloat16,
                                      loss_scale=1.0, verbosity=0)
    try:
        for seed in steps:
            generator = torch.Generator().manual_seed(seed)
            x, y = torch.randn(16, 6, generator=generator), torch.randn(16, 1, generator=generator)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.bfloat16()).float(), y)
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            optimizer.step()
        return model, optimizer, copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("make_optimizer", [o[1] for o in TORCH_OPTIMIZERS], ids=[o[0] for o in TORCH_OPTIMIZERS])
def test_o3_casts_optimizer_state_loaded_before_initialize_and_resumes_exactly(make_optimizer):
    """apex's initialize reloaded the optimizer's own state_dict so that state follows the cast params; an
    fp32 momentum beside bf16 params took a different path from the uninterrupted run."""
    _, _, saved = _o3_run(make_optimizer, [1, 2, 3])
    _, _, reference = _o3_run(make_optimizer, [1, 2, 3, 4, 5])
    model, optimizer, resumed = _o3_run(make_optimizer, [4, 5], state=saved)
    for param in model.parameters():
        assert all(value.dtype == param.dtype for value in optimizer.state[param].values()
                   if torch.is_tensor(value) and value.is_floating_point() and value.dim() > 0)
    for name, value in reference["model"].items():
        assert torch.equal(resumed["model"][name], value), name


FUSED = lambda params: FusedAdam(params, lr=1e-2, adam_w_mode=False)  # noqa: E731
# (id, the optimizer of the O2 run that saved, the optimizer of the O2 run that resumes)
STALE_CASES = [("adam", TORCH_OPTIMIZERS[0][1], TORCH_OPTIMIZERS[0][1]),
               ("sgd", TORCH_OPTIMIZERS[1][1], TORCH_OPTIMIZERS[1][1]),
               ("fused-adam", FUSED, FUSED),
               ("fused-adam-then-adam", FUSED, TORCH_OPTIMIZERS[0][1])]


@pytest.mark.parametrize("load_before_initialize", [True, False], ids=["load-then-initialize", "initialize-then-load"])
@pytest.mark.parametrize("saved_by, resumed_by", [case[1:] for case in STALE_CASES], ids=[c[0] for c in STALE_CASES])
def test_masters_a_run_without_amp_kept_give_way_to_its_newer_weights(saved_by, resumed_by, load_before_initialize,
                                                                       caplog):
    """An O2 checkpoint, then training on without amp (torch's optimizer keeps the masters' entries as they are,
    never updated, and saves them again), then back to O2: the stale masters once came back and the model
    jumped back to the first checkpoint. The loaded model weights win, as apex built its masters from them."""
    caplog.set_level("WARNING", logger="apexlite")
    checkpoint, _ = _checkpoint_and_reference(saved_by)
    model = _model()
    model.load_state_dict(checkpoint["model"])
    native = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if saved_by is TORCH_OPTIMIZERS[1][1] \
        else torch.optim.Adam(model.parameters(), lr=1e-2)
    native.load_state_dict(checkpoint["optimizer"])
    generator = torch.Generator().manual_seed(3)
    for _ in range(3):
        x, y = torch.randn(16, 6, generator=generator), torch.randn(16, 1, generator=generator)
        native.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        native.step()
    newer = copy.deepcopy({"model": model.state_dict(), "optimizer": native.state_dict()})
    weights = [p.detach().clone() for p in model.parameters()]
    model = _model()
    optimizer = resumed_by(model.parameters())
    try:
        if load_before_initialize:
            model.load_state_dict(newer["model"])
            optimizer.load_state_dict(newer["optimizer"])
            model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
        else:  # apex's documented order
            model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
            model.load_state_dict(newer["model"])
            optimizer.load_state_dict(newer["optimizer"])
        for master, param, weight in zip(amp.master_params(optimizer), model.parameters(), weights):
            assert torch.equal(master, weight if load_before_initialize else weight.half().float())
            assert torch.equal(param, weight.half())
        # warned wherever saved masters were there to be taken (a torch optimizer's own masters list is dropped
        # by torch's load after initialize: the masters come from the model then, as they should)
        uses_saved_masters = load_before_initialize or saved_by is FUSED
        assert ("a run without amp kept" in caplog.text) == uses_saved_masters
    finally:
        amp.deinitialize()


def _frozen_first_layer_run(start, stop, model, optimizer):
    """Steps [start, stop) of a fine-tuning schedule: the first layer, frozen at initialize, unfrozen at step 5."""
    for step in range(start, stop):
        if step == 5:
            model[0].weight.requires_grad_(True)
        generator = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 6, generator=generator), torch.randn(16, 1, generator=generator)
        optimizer.zero_grad()
        with amp.scale_loss(torch.nn.functional.mse_loss(model(x.half()).float(), y), optimizer) as scaled:
            scaled.backward()
        optimizer.step()


@pytest.mark.parametrize("load_before_initialize", [True, False], ids=["load-then-initialize", "initialize-then-load"])
def test_a_layer_unfrozen_after_the_resume_trains_as_in_the_uninterrupted_run(load_before_initialize):
    """A layer frozen at the checkpoint and unfrozen later gets its master from its half weights in both runs, as
    apex made it: the uninterrupted run once kept the fp32 weights from before the cast for it (and their memory,
    a frozen backbone's worth), which a checkpoint does not hold, and the runs parted by 2.4e-4."""
    def build():
        model = _model()
        model[0].weight.requires_grad_(False)
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    model, optimizer = amp.initialize(*build(), opt_level="O2", verbosity=0)
    try:
        _frozen_first_layer_run(0, 3, model, optimizer)
        checkpoint = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                    "amp": amp.state_dict()})
        _frozen_first_layer_run(3, 8, model, optimizer)
        uninterrupted = [p.detach().clone() for p in model.parameters()]
    finally:
        amp.deinitialize()
    model, optimizer = build()
    try:
        if load_before_initialize:
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
        if not load_before_initialize:
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
        amp.load_state_dict(checkpoint["amp"])
        _frozen_first_layer_run(3, 8, model, optimizer)
        assert all(torch.equal(got, want) for got, want in zip(model.parameters(), uninterrupted))
    finally:
        amp.deinitialize()
