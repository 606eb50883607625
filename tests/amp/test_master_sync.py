"""O2's fp32 masters pick up model weights written between amp.initialize and the first use (master_sync.py).

apex built its masters from the low-precision model weights at the first backward, zero_grad or
add_param_group, so weights loaded into the model after `initialize` (fine-tuning from weights alone) or
broadcast into it (DDP) were what it trained. apexlite builds masters in `initialize`; these tests hold
it to apex's documented result on both O2 paths (separate masters with a torch optimizer, FusedAdam's
fused masters): a written param's master is that param, upcast; an untouched param keeps the exact fp32
weight it started from. One step beyond apex: a param `load_state_dict` wrote from an fp32 value gets that
value as its master, unrounded (apex trained from the fp16 rounding of fine-tuning weights).
"""
import copy
import io

import pytest
import torch

from apexlite import amp
from apexlite.amp.errors import AmpUsageError
from apexlite.optimizers import FusedAdam

LOW = [torch.float16, torch.bfloat16]
# optimizer name -> a maker; lr 0 so a step changes no weight and only the masters' origin shows
OPTIMIZERS = {
    "SGD, separate masters": lambda params: torch.optim.SGD(params, lr=0.0),
    "FusedAdam, fused masters": lambda params: FusedAdam(params, lr=0.0),
}


@pytest.fixture(autouse=True)
def _teardown():
    yield
    amp.deinitialize()


def _set_up(make, low):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    originals = [p.detach().clone() for p in model.parameters()]
    model, optimizer = amp.initialize(model, make(model.parameters()), opt_level="O2", dtype=low,
                                      loss_scale=1.0, verbosity=0)
    return model, optimizer, originals


def _backward_and_step(model, optimizer, low):
    loss = model(torch.randn(3, 5, dtype=low)).float().square().mean()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()


def _loaded_weights(model, seed=1):
    """fp32 weights for `model.load_state_dict`, as a checkpoint of the fp32 model holds them."""
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(value.shape, generator=gen) for name, value in model.state_dict().items()}


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_weights_loaded_after_initialize_are_trained_not_reverted(name, low):
    model, optimizer, _ = _set_up(OPTIMIZERS[name], low)
    loaded = _loaded_weights(model)
    model.load_state_dict(loaded)
    _backward_and_step(model, optimizer, low)
    for param, value in zip(model.parameters(), loaded.values()):
        assert torch.equal(param, value.to(low))  # what load_state_dict wrote into the low-precision model
    for master, value in zip(amp.master_params(optimizer), loaded.values()):
        assert master.dtype == torch.float32 and torch.equal(master, value)  # the loaded fp32 value, unrounded
    assert any(not torch.equal(v, v.to(low).float()) for v in loaded.values())  # rounding would have shown


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_weights_loaded_in_low_precision_give_masters_their_upcast(name):
    """A checkpoint saved in bf16 holds nothing finer than the model param: the master is the param, upcast."""
    low = torch.bfloat16
    model, optimizer, _ = _set_up(OPTIMIZERS[name], low)
    loaded = {key: value.to(low) for key, value in _loaded_weights(model).items()}
    model.load_state_dict(loaded)
    _backward_and_step(model, optimizer, low)
    for master, value in zip(amp.master_params(optimizer), loaded.values()):
        assert torch.equal(master, value.float())


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_partial_load_sets_exactly_the_masters_it_wrote(name):
    """strict=False with a key missing, and a load of one layer through the whole model's hooks: the masters of
    the params written take the loaded values, the others keep their exact fp32 start."""
    low = torch.bfloat16
    model, optimizer, originals = _set_up(OPTIMIZERS[name], low)
    loaded = _loaded_weights(model)
    del loaded["0.bias"]
    model.load_state_dict(loaded, strict=False)
    _backward_and_step(model, optimizer, low)
    expected = [loaded["0.weight"], originals[1], loaded["2.weight"], loaded["2.bias"]]
    assert all(torch.equal(m, e) for m, e in zip(amp.master_params(optimizer), expected))


def test_a_load_that_fails_on_a_shape_leaves_the_masters_of_what_it_did_not_write():
    """torch writes the matching tensors and then raises for the mismatched one: masters follow exactly that."""
    low = torch.bfloat16
    model, optimizer, originals = _set_up(OPTIMIZERS["SGD, separate masters"], low)
    loaded = _loaded_weights(model)
    loaded["2.weight"] = torch.zeros(3, 3)
    with pytest.raises(RuntimeError, match="size mismatch"):
        model.load_state_dict(loaded)
    _backward_and_step(model, optimizer, low)
    expected = [loaded["0.weight"], loaded["0.bias"], originals[2], loaded["2.bias"]]
    assert all(torch.equal(m, e) for m, e in zip(amp.master_params(optimizer), expected))


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_only_written_params_get_new_masters_the_others_keep_fp32(name, low):
    model, optimizer, originals = _set_up(OPTIMIZERS[name], low)
    first = next(model.parameters())
    with torch.no_grad():
        first.fill_(0.25)  # as a broadcast writes the model in place
    _backward_and_step(model, optimizer, low)
    masters = list(amp.master_params(optimizer))
    assert torch.equal(masters[0], torch.full_like(masters[0], 0.25))
    for master, original in zip(masters[1:], originals[1:]):
        assert torch.equal(master, original)  # not rounded through the low dtype
    assert any(not torch.equal(o, o.to(low).float()) for o in originals[1:])  # rounding would have shown


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_zero_grad_is_a_first_use_too(name):
    model, optimizer, _ = _set_up(OPTIMIZERS[name], torch.bfloat16)
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(-1.5)
    optimizer.zero_grad()
    assert all(torch.equal(m, torch.full_like(m, -1.5)) for m in amp.master_params(optimizer))


def test_a_checkpoint_saved_before_the_first_step_holds_the_loaded_weights():
    model, optimizer, _ = _set_up(OPTIMIZERS["SGD, separate masters"], torch.float16)
    loaded = _loaded_weights(model)
    model.load_state_dict(loaded)
    state = optimizer.state_dict()
    amp.deinitialize()
    restored_model, restored_optimizer, _ = _set_up(OPTIMIZERS["SGD, separate masters"], torch.float16)
    restored_optimizer.load_state_dict(state)
    for param, value in zip(restored_model.parameters(), loaded.values()):
        assert torch.equal(param, value.to(torch.float16))


def test_weights_written_after_the_first_step_are_overwritten_by_the_masters_as_in_apex():
    """Once the masters exist (apex: after lazy init), they are the truth: the next step copies them back."""
    model, optimizer, originals = _set_up(OPTIMIZERS["SGD, separate masters"], torch.bfloat16)
    _backward_and_step(model, optimizer, torch.bfloat16)
    with torch.no_grad():
        next(model.parameters()).fill_(3.0)
    _backward_and_step(model, optimizer, torch.bfloat16)
    assert torch.equal(next(model.parameters()), originals[0].to(torch.bfloat16))


@pytest.mark.parametrize("whole_model", [True, False], ids=["model", "one layer"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_weights_loaded_after_steps_are_trained_not_reverted(name, whole_model):
    """Reloading the best weights mid-run (apex's next step copied the stale masters back): a load_state_dict of
    the model, or of one of its layers, re-arms the check; an untouched layer keeps its fp32 masters."""
    low = torch.bfloat16
    model, optimizer, _ = _set_up(OPTIMIZERS[name], low)
    for group in optimizer.param_groups:
        group["lr"] = 0.05
    for _ in range(3):
        _backward_and_step(model, optimizer, low)
    masters_before = [m.detach().clone() for m in amp.master_params(optimizer)]
    loaded = _loaded_weights(model)
    if whole_model:
        model.load_state_dict(loaded)
    else:
        model[2].load_state_dict({"weight": loaded["2.weight"], "bias": loaded["2.bias"]})
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    _backward_and_step(model, optimizer, low)
    for index, (param, master) in enumerate(zip(model.parameters(), amp.master_params(optimizer))):
        key = ["0.weight", "0.bias", "2.weight", "2.bias"][index]
        if whole_model or key.startswith("2."):
            assert torch.equal(param, loaded[key].to(low)) and torch.equal(master, loaded[key])
        else:
            assert torch.equal(master, masters_before[index])  # fp32 precision kept where nothing was loaded


def test_a_load_with_assign_is_refused_before_it_replaces_a_param():
    """assign=True would put fp32 tensors in place of the cast params the masters follow (then a dtype error at
    the next forward, or a model the optimizer no longer steps)."""
    model, _, _ = _set_up(OPTIMIZERS["SGD, separate masters"], torch.bfloat16)
    params = list(model.parameters())
    with pytest.raises(AmpUsageError, match="assign=True"):
        model.load_state_dict(_loaded_weights(model), assign=True)
    assert all(a is b for a, b in zip(params, model.parameters()))


def test_the_load_hooks_go_with_the_session():
    model, optimizer, _ = _set_up(OPTIMIZERS["SGD, separate masters"], torch.bfloat16)
    assert all(module._load_state_dict_post_hooks and module._load_state_dict_pre_hooks
               for module in model.modules())
    amp.deinitialize()
    assert not any(module._load_state_dict_post_hooks or module._load_state_dict_pre_hooks
                   for module in model.modules())


def _copied(model, how):
    if how == "deepcopy":
        return copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_copy_of_the_model_computes_alike_and_its_loads_leave_the_masters_alone(name, how):
    """An EMA copy (copy.deepcopy) or a whole-model save of an O2 model: the copy runs the same forward, and
    loading weights into the copy does not re-arm the original's masters (its params are no optimizer's)."""
    low = torch.bfloat16
    model, optimizer, _ = _set_up(OPTIMIZERS[name], low)
    for group in optimizer.param_groups:
        group["lr"] = 0.05
    _backward_and_step(model, optimizer, low)
    twin = _copied(model, how)
    x = torch.randn(3, 5, dtype=low)
    assert torch.equal(twin(x), model(x))
    masters_before = [m.detach().clone() for m in amp.master_params(optimizer)]
    twin.load_state_dict(_loaded_weights(model))
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    _backward_and_step(model, optimizer, low)
    assert all(torch.equal(m, b) for m, b in zip(amp.master_params(optimizer), masters_before))
    assert not torch.equal(twin(x), model(x))


class LoadsItsBody(torch.nn.Module):
    """Loads a child through the child's own load_state_dict, as some libraries' wrappers do (a load inside a
    load)."""

    def __init__(self):
        super().__init__()
        self.head, self.body = torch.nn.Linear(5, 7), torch.nn.Linear(7, 2)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        body = {key[len(prefix) + 5:]: value for key, value in state_dict.items() if key.startswith(prefix + "body.")}
        if body:
            self.body.load_state_dict(body)

    def forward(self, x):
        return self.body(torch.tanh(self.head(x)))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_load_inside_a_load_gives_every_master_its_loaded_value_and_keeps_nothing(name):
    from apexlite.amp.session import current_session

    model = LoadsItsBody()
    model, optimizer = amp.initialize(model, OPTIMIZERS[name](model.parameters()), opt_level="O2",
                                      dtype=torch.bfloat16, loss_scale=1.0, verbosity=0)
    loaded = _loaded_weights(model)
    model.load_state_dict(loaded)
    assert not current_session().model_loads.values  # no checkpoint tensor held after the load
    _backward_and_step(model, optimizer, torch.bfloat16)
    assert all(torch.equal(m, loaded[key]) for m, key in zip(amp.master_params(optimizer), loaded))


def test_fp64_values_are_loaded_into_the_masters_as_fp32():
    model, optimizer, _ = _set_up(OPTIMIZERS["SGD, separate masters"], torch.bfloat16)
    loaded = {key: value.double() for key, value in _loaded_weights(model).items()}
    model.load_state_dict(loaded)
    _backward_and_step(model, optimizer, torch.bfloat16)
    for master, param, value in zip(amp.master_params(optimizer), model.parameters(), loaded.values()):
        assert torch.equal(param, value.to(torch.bfloat16))
        assert torch.equal(master, value.float()) or torch.equal(master, param.float())  # a double rounding apart


class RefusesToLoad(torch.nn.Linear):
    def _load_from_state_dict(self, *args, **kwargs):
        raise ValueError("this layer cannot load")


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_weights_a_load_wrote_before_it_raised_are_trained_not_reverted(name):
    """After the masters are in use, a load that raises half-way (a custom layer refusing) has written the
    layers before it: the next step trains those, as a completed load's are."""
    low = torch.bfloat16
    model, optimizer, _ = _set_up(OPTIMIZERS[name], low)
    _backward_and_step(model, optimizer, low)
    loaded = _loaded_weights(model)
    model[2].__class__ = RefusesToLoad
    with pytest.raises(ValueError, match="cannot load"):
        model.load_state_dict(loaded)
    model[2].__class__ = torch.nn.Linear
    _backward_and_step(model, optimizer, low)  # lr 0: the masters' origin alone shows
    masters = list(amp.master_params(optimizer))
    assert torch.equal(masters[0], loaded["0.weight"]) and torch.equal(masters[1], loaded["0.bias"])
    assert torch.equal(model[0].weight, loaded["0.weight"].to(low))


def _held_values():
    from apexlite.amp.session import current_session

    return current_session().model_loads.values


def test_a_load_after_one_cut_short_hands_its_values_over_when_it_ends():
    """The cut-short load leaves no open root behind: the next complete load sets its masters at once (read
    before any step through amp.master_params, apex's place to read and write them) and holds nothing."""
    model, optimizer, _ = _set_up(OPTIMIZERS["SGD, separate masters"], torch.bfloat16)
    model[2].__class__ = RefusesToLoad
    with pytest.raises(ValueError):
        model.load_state_dict(_loaded_weights(model, seed=2))
    model[2].__class__ = torch.nn.Linear
    loaded = _loaded_weights(model, seed=3)
    model.load_state_dict(loaded)
    assert not _held_values()
    assert all(torch.equal(m, v) for m, v in zip(amp.master_params(optimizer), loaded.values()))


class Holder(torch.nn.Module):
    """A DDP-style container of the registered model (`module.` keys), as torch.compile's OptimizedModule is."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def test_a_load_through_a_container_of_the_model_sets_the_masters_at_its_end():
    model, optimizer, _ = _set_up(OPTIMIZERS["FusedAdam, fused masters"], torch.bfloat16)
    loaded = _loaded_weights(model)
    Holder(model).load_state_dict({"module." + key: value for key, value in loaded.items()})
    assert not _held_values()
    assert all(torch.equal(m, v) for m, v in zip(amp.master_params(optimizer), loaded.values()))


def test_two_threads_loading_two_models_each_set_their_own_masters():
    import threading

    torch.manual_seed(0)
    models = [torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(30)]) for _ in range(2)]
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.0) for model in models]
    models, optimizers = amp.initialize(models, optimizers, opt_level="O2", dtype=torch.bfloat16, verbosity=0)
    for trial in range(10):  # loads that overlap (the two threads once shared one record of loads in progress)
        loads = [_loaded_weights(model, seed=2 * trial + index) for index, model in enumerate(models)]
        barrier = threading.Barrier(2)

        def load(index):
            barrier.wait()
            models[index].load_state_dict(loads[index])

        threads = [threading.Thread(target=load, args=(index,)) for index in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for optimizer, loaded in zip(optimizers, loads):
            assert all(torch.equal(m, v) for m, v in zip(amp.master_params(optimizer), loaded.values())), trial
