"""Loss scaling: the schedule against a reference model of the rules, overflow skips, checkpoints."""
import logging
import random

import pytest
import torch

from apexlite import amp
from apexlite.amp.scaler import LossScaler, next_scale
from apexlite.amp.session import current_session


def reference_schedule(events, window, min_scale, max_scale, start=2.0 ** 16):
    """A from-the-docs model: halve on overflow (floored at min_scale, and never below 2**-24, where
    1/scale stops being a safe float32), double after `window` clean exits (capped)."""
    scale, clean, out = min(start, max_scale), 0, []
    for overflow in events:
        if overflow:
            scale, clean = max(scale / 2, 2.0 ** -24), 0
            if min_scale:
                scale = max(scale, min_scale)
        else:
            clean += 1
            if clean == window:
                scale, clean = min(scale * 2, max_scale), 0
        out.append(scale)
    return out


@pytest.mark.parametrize("window,min_scale,max_scale", [(3, None, 2.0 ** 24), (2, 1024.0, 2.0 ** 17), (5, None, 2.0 ** 10)])
def test_dynamic_schedule_matches_reference_rules(window, min_scale, max_scale):
    rng = random.Random(window)
    events = [rng.random() < 0.3 for _ in range(200)]
    scale, clean = min(2.0 ** 16, max_scale), 0
    got = []
    for overflow in events:
        scale, clean = next_scale(scale, clean, overflow, scale_factor=2.0, scale_window=window,
                                  min_loss_scale=min_scale, max_loss_scale=max_scale)
        got.append(scale)
    assert got == reference_schedule(events, window, min_scale, max_scale)


def test_scale_doubles_after_2000_clean_steps_by_default():
    scaler = LossScaler("dynamic")
    for _ in range(1999):
        scaler.update_scale()
    assert scaler.loss_scale() == 2.0 ** 16
    scaler.update_scale()
    assert scaler.loss_scale() == 2.0 ** 17 and scaler._unskipped == 0


def _model_and_opt(opt_cls=torch.optim.Adam, **init):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = opt_cls(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, **{"verbosity": 0, **init})
    return model, opt


def _train_step(model, opt, x, poison=None):
    loss = model(x).float().pow(2).mean()
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
        if poison is not None:
            poison(model)
    opt.step()
    opt.zero_grad()


def _snapshot(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    state = {id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for p, s in opt.state.items()}
    return params, state


POSITIONS = ["first", "middle", "last"]


@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
@pytest.mark.parametrize("which_param", [0, -1], ids=["first_param", "last_param"])
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_overflow_leaves_params_and_state_bit_identical(value, which_param, position, opt_level):
    model, opt = _model_and_opt(opt_level=opt_level)
    x = torch.randn(3, 4)
    try:
        _train_step(model, opt, x)  # create optimizer state
        before_params, before_state = _snapshot(model, opt)
        masters_before = [m.detach().clone() for m in amp.master_params(opt)]
        scale_before = current_session().loss_scalers[0].loss_scale()

        def poison(m):
            grad = list(m.parameters())[which_param].grad.view(-1)
            index = {"first": 0, "middle": grad.numel() // 2, "last": grad.numel() - 1}[position]
            grad[index] = value

        _train_step(model, opt, x, poison)
        after_params, after_state = _snapshot(model, opt)
        for a, b in zip(before_params, after_params):
            assert torch.equal(a, b)
        for a, b in zip(masters_before, amp.master_params(opt)):
            assert torch.equal(a, b)
        assert before_state.keys() == after_state.keys()
        for key in before_state:
            for name, tensor in before_state[key].items():
                assert torch.equal(tensor, after_state[key][name])
        assert current_session().loss_scalers[0].loss_scale() == scale_before / 2
    finally:
        amp.deinitialize()


def test_overflow_message_is_logged_at_step(caplog):
    model, opt = _model_and_opt(opt_level="O1", verbosity=1)
    try:
        with caplog.at_level(logging.INFO, logger="apexlite"):
            _train_step(model, opt, torch.randn(3, 4), lambda m: m[0].weight.grad.fill_(float("inf")))
    finally:
        amp.deinitialize()
    assert "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0" in caplog.text


def test_400_steps_with_random_poison_match_a_run_that_omits_those_steps():
    torch.manual_seed(0)
    data = [torch.randn(3, 4) for _ in range(400)]
    poisoned = set(random.Random(1).sample(range(400), 40))
    model, opt = _model_and_opt(torch.optim.SGD, opt_level="O1", dtype=torch.bfloat16, loss_scale=128.0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    reference.load_state_dict(model.state_dict())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=1e-2)
    try:
        for step, x in enumerate(data):
            poison = (lambda m: m[2].bias.grad.fill_(float("nan"))) if step in poisoned else None
            _train_step(model, opt, x, poison)
        assert current_session().stats.skipped_steps == 40
    finally:
        amp.deinitialize()
    amp.initialize(reference, ref_opt, opt_level="O1", dtype=torch.bfloat16, verbosity=0, loss_scale=128.0)
    try:
        for step, x in enumerate(data):
            if step not in poisoned:
                _train_step(reference, ref_opt, x)
    finally:
        amp.deinitialize()
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)


def test_static_scale_one_skips_all_bookkeeping():
    model, opt = _model_and_opt(opt_level="O3", dtype=torch.bfloat16)
    try:
        loss = model(torch.randn(3, 4)).float().sum()
        with amp.scale_loss(loss, opt) as scaled:
            assert scaled is loss or torch.equal(scaled, loss.float())
            scaled.backward()
        assert current_session().loss_scalers[0]._found_inf == {}
    finally:
        amp.deinitialize()


def test_state_dict_round_trip_and_gradscaler_format():
    model, opt = _model_and_opt(opt_level="O1", num_losses=2)
    try:
        scalers = current_session().loss_scalers
        scalers[0]._loss_scale, scalers[0]._unskipped = 1024.0, 7
        saved = amp.state_dict()
        assert list(saved) == ["loss_scaler0", "loss_scaler1"]
        assert saved["loss_scaler0"] == {"loss_scale": 1024.0, "unskipped": 7}
        scalers[0]._loss_scale, scalers[0]._unskipped = 1.0, 0
        amp.load_state_dict(saved)
        assert scalers[0].state_dict() == {"loss_scale": 1024.0, "unskipped": 7}
        grad_scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
        amp.load_state_dict({"scale": 512.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                             "growth_interval": 2000, "_growth_tracker": 3})
        assert grad_scaler.get_scale() == scalers[1].loss_scale() == 512.0 and scalers[1]._unskipped == 3
        with pytest.raises(RuntimeError, match="Unexpected key"):
            amp.load_state_dict({"loss_scaler0": saved["loss_scaler0"], "bogus": 1})
    finally:
        amp.deinitialize()


def test_delay_unscale_accumulates_and_step_too_early_is_an_error():
    model, opt = _model_and_opt(torch.optim.SGD, opt_level="O1", dtype=torch.float16)
    xs = [torch.randn(3, 4) for _ in range(3)]
    try:
        for i, x in enumerate(xs):
            loss = model(x).float().pow(2).mean()
            with amp.scale_loss(loss, opt, delay_unscale=i < 2) as scaled:
                scaled.backward()
            if i == 0:
                with pytest.raises(RuntimeError, match="still scaled"):
                    opt.step()
        accumulated = [p.grad.clone() for p in model.parameters()]
    finally:
        amp.deinitialize()
    model.zero_grad()
    amp.initialize(model, opt_level="O1", dtype=torch.float16, verbosity=0)
    try:
        for x in xs:
            model(x).float().pow(2).mean().backward()
    finally:
        amp.deinitialize()
    for a, p in zip(accumulated, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("low,loss_scale", [(torch.float16, "dynamic"), (torch.bfloat16, 1.0), (torch.bfloat16, 256.0)],
                         ids=str)
def test_o1_grads_after_scale_loss_match_fp32_reference_grads(low, loss_scale):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", dtype=low, loss_scale=loss_scale, verbosity=0)
    try:
        with amp.scale_loss(torch.nn.functional.mse_loss(model(x), y), opt) as scaled:
            scaled.backward()
    finally:
        amp.deinitialize()
    tols = {torch.float16: dict(rtol=5e-3, atol=1e-3), torch.bfloat16: dict(rtol=4e-2, atol=1e-2)}[low]
    for p, r in zip(model.parameters(), reference.parameters()):
        assert p.grad.dtype is torch.float32
        torch.testing.assert_close(p.grad, r.grad, **tols)


def test_a_static_scale_that_overflows_every_step_says_nothing_trains(caplog):
    """Every step skipped at a static scale (apexlite skips where apex stepped inf grads): said at 10 and 100
    consecutive overflows, not between; a clean step starts the count again."""
    model, opt = _model_and_opt(opt_level="O1", dtype=torch.bfloat16, loss_scale=2.0 ** 120)
    try:
        before = [p.detach().clone() for p in model.parameters()]
        with caplog.at_level(logging.WARNING, logger="apexlite.amp"):
            for _ in range(100):
                _train_step(model, opt, torch.full((3, 4), 1e4))
        said = [r.getMessage() for r in caplog.records if "consecutive steps overflowed" in r.getMessage()]
        assert [message.split()[0] for message in said] == ["10", "100"]
        assert "static loss scale 1.32923e+36" in said[0] and "loss_scale='dynamic'" in said[0]
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # the claim is true
    finally:
        amp.deinitialize()


def test_loading_a_state_over_a_static_scale_says_it_replaces_it(caplog):
    model, opt = _model_and_opt(opt_level="O1", loss_scale=128.0)
    try:
        with caplog.at_level(logging.WARNING, logger="apexlite.amp"):
            amp.load_state_dict({"loss_scaler0": {"loss_scale": 65536.0, "unskipped": 5}})
            amp.load_state_dict({"loss_scaler0": {"loss_scale": 65536.0, "unskipped": 6}})
        said = [r.getMessage() for r in caplog.records if "replaces this run's static loss scale" in r.getMessage()]
        assert said == ["a loaded loss scaler state replaces this run's static loss scale 128 with 65536 (as apex "
                        "did); keep 128 by leaving the checkpoint's amp state out"]
        assert current_session().loss_scalers[0].loss_scale() == 65536.0
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("second_scale,warned", [(1024.0, "64x too large"), (65536.0, None)])
def test_delay_unscale_across_loss_ids_of_different_scales_is_warned_once(caplog, second_scale, warned):
    """apex unscaled every delayed grad with the closing block's scale (handle.py); apexlite does the same, and
    says so once when the delayed grads carried another scale (the reviewer's grads came out 37-48x too large)."""
    model, opt = _model_and_opt(torch.optim.SGD, opt_level="O1", dtype=torch.float16, num_losses=2)
    try:
        scalers = current_session().loss_scalers
        scalers[1]._loss_scale = second_scale
        with caplog.at_level(logging.WARNING, logger="apexlite"):
            for _ in range(2):
                for loss_id, delay in ((0, True), (1, False)):
                    loss = model(torch.randn(3, 4)).float().pow(2).mean()
                    with amp.scale_loss(loss, opt, loss_id=loss_id, delay_unscale=delay) as scaled:
                        scaled.backward()
                opt.step()
                opt.zero_grad()
        said = [record.getMessage() for record in caplog.records if "delay_unscale=True" in record.getMessage()]
        assert said == ([] if warned is None else [said[0]]) and (warned is None or warned in said[0])
    finally:
        amp.deinitialize()
