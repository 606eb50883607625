"""`amp.initialize` called again without `deinitialize`, as apex allowed and its own tests do.

Semantics (NOTE in apexlite/amp/session.py): the latest call's options apply, the loss scalers are
replaced by fresh ones that every registered optimizer shares (apex's scalers were process-global),
models and optimizers of earlier calls keep working, O1's patches are installed once.
"""
import copy
import logging

import pytest
import torch
import torch.nn.functional as F

from apexlite import amp
from apexlite.amp.o1.lists import op_entries
from apexlite.amp.o1.patcher import resolve
from apexlite.amp.session import current_session
from tests._helpers.torch_snapshot import snapshot_patch_targets, unchanged_since

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

LEVELS = ("O0", "O1", "O2", "O3")


class Net(torch.nn.Module):
    """apex's checkpointing-test shape: a scalar param, a conv, batchnorm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, 1, 1)
        self.bn = torch.nn.BatchNorm2d(6)
        self.param = torch.nn.Parameter(torch.randn(1))

    def forward(self, x):
        return self.bn(F.relu(self.conv(x * self.param)))


def train(model, opt, batches, loss_ids=(0,)):
    outputs = []
    for x in batches:
        opt.zero_grad()
        out = model(x)
        for loss_id in loss_ids:
            with amp.scale_loss(out.float().mean(), opt, loss_id=loss_id) as scaled:
                scaled.backward(retain_graph=True)
        opt.step()
        outputs.append(out.detach().float())
    return outputs


def batches(n, seed=7):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, 6, 6, generator=generator) for _ in range(n)]


def fresh_run(level, data):
    """Reference: the same training in a session of its own."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level=level, dtype=torch.bfloat16, verbosity=0)
    try:
        return train(model, opt, data)
    finally:
        amp.deinitialize()


def test_an_opt_level_loop_of_four_initialize_calls_trains_each_level_like_a_fresh_session():
    data = batches(3)
    expected = {level: fresh_run(level, data) for level in LEVELS}
    got = {}
    try:
        for level in LEVELS:  # no deinitialize in between, as apex's tests and sweep scripts do
            torch.manual_seed(0)
            model = Net()
            opt = torch.optim.SGD(model.parameters(), lr=1e-2)
            model, opt = amp.initialize(model, opt, opt_level=level, dtype=torch.bfloat16, verbosity=0)
            assert current_session().properties.opt_level == level
            got[level] = train(model, opt, data)
        assert len(current_session().optimizers) == 4
    finally:
        amp.deinitialize()
    for level in LEVELS:
        for a, b in zip(expected[level], got[level]):
            assert torch.equal(a, b), level


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("amp_before_load", [True, False], ids=["init_then_load", "load_then_init"])
def test_a_restored_copy_trains_beside_the_original_with_equal_outputs(level, amp_before_load):
    data = batches(8)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level=level, num_losses=2, verbosity=0)
    try:
        train(model, opt, data[:4], loss_ids=(0,))
        checkpoint = copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict()})
        assert all(t.dtype in (torch.float32, torch.int64) for t in checkpoint["model"].values())

        restored = Net()
        restored_opt = torch.optim.SGD(restored.parameters(), lr=1e-2)
        if amp_before_load:
            restored, restored_opt = amp.initialize(restored, restored_opt, opt_level=level, num_losses=2, verbosity=0)
        restored.load_state_dict(checkpoint["model"])
        restored_opt.load_state_dict(checkpoint["optimizer"])
        if not amp_before_load:
            restored, restored_opt = amp.initialize(restored, restored_opt, opt_level=level, num_losses=2, verbosity=0)
        for x in data[4:]:
            out = train(model, opt, [x], loss_ids=(0,))[0]
            restored_out = train(restored, restored_opt, [x], loss_ids=(1,))[0]
            assert torch.allclose(out, restored_out)
        for (key, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
            assert torch.equal(a, b), key
    finally:
        amp.deinitialize()


def test_o1_patches_are_never_stacked_and_deinitialize_restores_the_originals():
    before = snapshot_patch_targets()
    originals = {e.qualname: getattr(resolve(e.namespace), e.name) for e in op_entries()}
    try:
        for _ in range(3):
            model = torch.nn.Linear(4, 4)
            amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O1", verbosity=0)
        wrapper = F.linear
        assert wrapper is not originals["torch.nn.functional.linear"]
        assert wrapper.__wrapped__ is originals["torch.nn.functional.linear"]  # one layer, not three
        descriptions = current_session().o1_patcher.descriptions()
        assert len(descriptions) == len(set(descriptions))
    finally:
        amp.deinitialize()
    assert unchanged_since(before)
    assert F.linear is originals["torch.nn.functional.linear"]


def test_verbosity_zero_says_nothing_when_called_again(caplog):
    """apex's verbosity=0 silenced amp's prints: the repeat call's INFO line is one of them."""
    models = [torch.nn.Linear(4, 4) for _ in range(2)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    try:
        amp.initialize(models[0], optimizers[0], opt_level="O1", dtype=torch.bfloat16, verbosity=0)
        with caplog.at_level(logging.INFO, logger="apexlite"):
            amp.initialize(models[1], optimizers[1], opt_level="O2", dtype=torch.bfloat16, verbosity=0)
        assert caplog.records == []
    finally:
        amp.deinitialize()


def test_latest_options_apply_and_earlier_optimizers_share_the_fresh_scalers(caplog):
    first = torch.nn.Linear(4, 4)
    first_opt = torch.optim.SGD(first.parameters(), lr=0.1)
    second = torch.nn.Linear(4, 4)
    second_opt = torch.optim.SGD(second.parameters(), lr=0.1)
    original_linear = F.linear
    try:
        amp.initialize(first, first_opt, opt_level="O1", loss_scale=128.0, verbosity=0)
        assert F.linear is not original_linear
        with caplog.at_level(logging.INFO, logger="apexlite"):
            amp.initialize(second, second_opt, opt_level="O2", num_losses=2, verbosity=1)
        assert "amp.initialize called again" in caplog.text and "extended" in caplog.text
        assert F.linear is original_linear  # O2 does not patch torch: the O1 layer is gone
        session = current_session()
        assert len(session.loss_scalers) == 2 and session.loss_scalers[0].loss_scale() == 2.0 ** 16
        # the first optimizer still works, with the new scaler 1
        x = torch.randn(3, 4)
        with amp.scale_loss(first(x).sum(), first_opt, loss_id=1) as scaled:
            assert scaled.item() == pytest.approx(first(x).sum().item() * 2.0 ** 16, rel=1e-3)
            scaled.backward()
        before = first.weight.detach().clone()
        first_opt.step()
        assert not torch.equal(before, first.weight)
        amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", dtype=torch.bfloat16, verbosity=0)
        assert first(x).dtype is torch.bfloat16  # O1 back on, with the latest dtype
    finally:
        amp.deinitialize()


def test_passing_an_optimizer_or_a_cast_model_again_is_still_an_error():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp.initialize(model, opt, opt_level="O2", verbosity=0)
    try:
        with pytest.raises(RuntimeError, match="only be passed through amp.initialize once"):
            amp.initialize(torch.nn.Linear(2, 2), opt, opt_level="O1", verbosity=0)
        with pytest.raises(RuntimeError, match="already passed to an earlier amp.initialize"):
            amp.initialize(model, opt_level="O2", verbosity=0)
        assert model.weight.dtype is torch.float16
    finally:
        amp.deinitialize()


def test_the_way_out_the_error_names_for_a_cast_model_trains_it_with_a_new_optimizer():
    """Stage two of a fine-tune: the error names `amp.initialize([], new_optimizer)`, not deinitialize (which
    leaves the model cast, so its next initialize would refuse the half model). The reference: the new
    optimizer steps the cast model as a first initialize of a model with those (bf16) weights would."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O2",
                                dtype=torch.bfloat16, verbosity=0)
    x = torch.randn(8, 4)
    try:
        new_opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(RuntimeError, match=r"pass the optimizer alone: `_, optimizer = amp.initialize\(\[\]"):
            amp.initialize(model, new_opt, opt_level="O2", dtype=torch.bfloat16, verbosity=0)
        reference = torch.nn.Linear(4, 3)
        reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        _, new_opt = amp.initialize([], new_opt, opt_level="O2", dtype=torch.bfloat16, verbosity=0)
        with amp.scale_loss(model(x).float().sum(), new_opt) as scaled:
            scaled.backward()
        new_opt.step()
        stepped = {k: v.clone() for k, v in model.state_dict().items()}
    finally:
        amp.deinitialize()
    reference, reference_opt = amp.initialize(reference, torch.optim.SGD(reference.parameters(), lr=0.1),
                                              opt_level="O2", dtype=torch.bfloat16, verbosity=0)
    try:
        with amp.scale_loss(reference(x).float().sum(), reference_opt) as scaled:
            scaled.backward()
        reference_opt.step()
        assert all(torch.equal(stepped[k], v) for k, v in reference.state_dict().items())
    finally:
        amp.deinitialize()


def test_an_o1_model_can_still_be_deep_copied_and_pickled():
    import pickle

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    amp.initialize(model, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        twin = copy.deepcopy(model)
        clone = pickle.loads(pickle.dumps(model))
        x = torch.randn(2, 4)
        assert torch.equal(twin(x), model(x)) and torch.equal(clone(x), model(x))
    finally:
        amp.deinitialize()


def test_initialize_enabled_false_after_o1_turns_everything_off():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        amp.initialize(model, opt, opt_level="O1", verbosity=0)
        amp.initialize(model, opt, enabled=False, verbosity=0)
        x = torch.randn(2, 4)
        assert model(x).dtype is torch.float32
        loss = model(x).sum()
        with amp.scale_loss(loss, opt) as scaled:
            assert scaled is loss
    finally:
        amp.deinitialize()
