"""initialize/deinitialize: opt-level table, overrides and their errors, return shapes, banner, patch undo."""
import logging

import pytest
import torch

from apexlite import amp
from apexlite.amp.o1.lists import op_entries
from apexlite.amp.o1.patcher import resolve
from apexlite.amp.errors import AmpConfigError
from apexlite.amp.session import current_session

# apex's documented property table: (cast_model_type, patch_torch_functions, keep_batchnorm_fp32, master_weights, loss_scale)
APEX_TABLE = {
    "O0": (torch.float32, False, None, False, 1.0),
    "O1": (None, True, None, None, "dynamic"),
    "O2": (torch.float16, False, True, True, "dynamic"),
    "O3": (torch.float16, False, False, False, 1.0),
}


def model_opt():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.fixture(autouse=True)
def _teardown():
    yield
    amp.deinitialize()


@pytest.mark.parametrize("level", APEX_TABLE)
def test_opt_level_properties_match_apex(level):
    amp.initialize(*model_opt(), opt_level=level, verbosity=0)
    props = current_session().properties
    got = (props.cast_model_type, props.patch_torch_functions, props.keep_batchnorm_fp32,
           props.master_weights, props.loss_scale)
    assert got == APEX_TABLE[level] and props.enabled


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_bfloat16_defaults_to_loss_scale_one(level):
    amp.initialize(*model_opt(), opt_level=level, dtype=torch.bfloat16, verbosity=0)
    assert current_session().properties.loss_scale == 1.0


BAD_OVERRIDES = [
    (dict(opt_level="01"), "letter O, not the number zero"),
    (dict(opt_level="O1", cast_model_type=torch.float16), "cast_model_type"),
    (dict(opt_level="O2", patch_torch_functions=True), "patch_torch_functions"),
    (dict(opt_level="O1", keep_batchnorm_fp32=True), "keep_batchnorm_fp32"),
    (dict(opt_level="O2", keep_batchnorm_fp32="yes"), "keep_batchnorm_fp32"),
    (dict(opt_level="O1", master_weights=True), "master_weights"),
    (dict(opt_level="O1", loss_scale="big"), "loss_scale"),
    (dict(opt_level="O1", loss_scale=-1), "loss_scale"),
    (dict(opt_level="O1", loss_scale=True), "loss_scale must be a positive number"),
    (dict(opt_level="O1", num_losses=0), "num_losses"),
    (dict(opt_level="O1", dtype=torch.float64), "dtype"),
    (dict(opt_level="O1", min_loss_scale=2.0 ** 20, max_loss_scale=2.0 ** 10), "min_loss_scale"),
    (dict(opt_level="O2", cast_model_type=torch.float16, dtype=torch.bfloat16), "disagree"),
    (dict(opt_level="O1", cast_model_outputs="float16"), r"cast_model_outputs .* \(write torch.float16\)"),
    (dict(opt_level="O2", enabled="no"), "enabled must be True or False"),
    (dict(opt_level="O1", max_loss_scale=None), "max_loss_scale must be a number"),
    (dict(opt_level="O1", max_loss_scale="1e6"), "max_loss_scale must be a number"),
    (dict(opt_level="O1", min_loss_scale="a"), "min_loss_scale must be None or a number"),
    (dict(opt_level="O1", loss_scale=128.0, min_loss_scale=1024.0, max_loss_scale=16.0), "must not exceed"),
]


@pytest.mark.parametrize("kwargs,needle", BAD_OVERRIDES, ids=lambda v: str(v))
def test_bad_options_name_the_option(kwargs, needle):
    with pytest.raises(RuntimeError, match=needle):
        amp.initialize(*model_opt(), verbosity=0, **kwargs)
    assert current_session(required=False) is None


@pytest.mark.parametrize("enabled,on", [("False", False), ("True", True), (False, False), (None, False), (1, True)])
def test_enabled_as_argparse_or_a_config_gives_it(enabled, on):
    """A string "False" was truthy and cast the model (apex did the same)."""
    model, _ = amp.initialize(*model_opt(), opt_level="O3", enabled=enabled, verbosity=0)
    amp.deinitialize()
    assert model[0].weight.dtype is (torch.float16 if on else torch.float32)


def test_string_overrides_are_parsed():
    amp.initialize(*model_opt(), opt_level="O2", keep_batchnorm_fp32="False", loss_scale="128.0", verbosity=0)
    props = current_session().properties
    assert props.keep_batchnorm_fp32 is False and props.loss_scale == 128.0


@pytest.mark.parametrize("as_list_models,as_list_opts", [(False, False), (True, False), (False, True), (True, True)])
def test_returns_in_the_shape_given(as_list_models, as_list_opts):
    model, opt = model_opt()
    models = [model] if as_list_models else model
    opts = [opt] if as_list_opts else opt
    out_models, out_opts = amp.initialize(models, opts, verbosity=0)
    assert out_models is models and out_opts is opts


def test_model_only_returns_model():
    model, _ = model_opt()
    assert amp.initialize(model, verbosity=0) is model


MISUSE = [
    (lambda m, o: amp.initialize(torch.nn.DataParallel(m), o), "AFTER"),
    (lambda m, o: amp.initialize(m.half(), o), "do not need to call .half"),
    (lambda m, o: amp.initialize(m, (o,)), "single optimizer or a list"),
    (lambda m, o: amp.initialize(m, torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1), opt_level="O2"),
     "none of the 1 parameters SGD holds belongs to a model"),
    (lambda m, o: amp.initialize(m, torch.optim.SGD([*m.parameters(), torch.nn.Parameter(torch.ones(2).half())], lr=1),
                                 opt_level="O2"), r"belong to no model .* not float32 \(shapes \[\(2,\)\]\)"),
    (lambda m, o: amp.initialize(m, torch.optim.LBFGS(m.parameters())), r"LBFGS steps only as optimizer.step\(closure\)"),
    (lambda m, o: amp.initialize(torch.jit.script(torch.nn.Linear(2, 2)), opt_level="O2"),
     "is a TorchScript module .* Pass the eager model"),
]


@pytest.mark.parametrize("call,needle", MISUSE)
def test_misuse_is_a_clear_error(call, needle):
    with pytest.raises(RuntimeError, match=needle):
        call(*model_opt())


def test_deinitialize_is_idempotent_and_allows_a_fresh_start():
    amp.initialize(*model_opt(), verbosity=0)
    amp.deinitialize()
    amp.deinitialize()  # idempotent
    assert current_session(required=False) is None
    amp.initialize(*model_opt(), verbosity=0)
    assert len(current_session().optimizers) == 1


def test_scale_loss_before_initialize_and_foreign_optimizer():
    with pytest.raises(RuntimeError, match="must be called before"):
        with amp.scale_loss(torch.ones(()), None):
            pass
    model, opt = model_opt()
    amp.initialize(model, opt, verbosity=0)
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="was not passed through amp.initialize"):
        with amp.scale_loss(model(torch.randn(2, 3)).sum(), other):
            pass
    with pytest.raises(RuntimeError, match="loss_id=1 is out of range"):
        with amp.scale_loss(model(torch.randn(2, 3)).sum(), opt, loss_id=1):
            pass
    loss = model(torch.randn(2, 3)).sum()
    for bad, needle in [(loss.item(), "needs the loss tensor .*got float"), ([loss, loss], "got list: sum the losses"),
                        (3, "got int")]:
        with pytest.raises(RuntimeError, match=needle):
            with amp.scale_loss(bad, opt):
                pass
    for bad_id in ("0", 0.0, True):
        with pytest.raises(RuntimeError, match="loss_id must be an int"):
            with amp.scale_loss(loss, opt, loss_id=bad_id):
                pass
    with pytest.raises(RuntimeError, match="takes one optimizer .* once per optimizer"):
        list(amp.master_params([opt]))


def test_banner_matches_apex_layout(caplog):
    with caplog.at_level(logging.INFO, logger="apexlite"):
        amp.initialize(*model_opt(), opt_level="O2")
    banners = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Selected optimization level")]
    assert len(banners) == 1  # (beside it, once per process, the advice on float16 on CPU)
    lines = banners[0].split("\n")
    assert lines[0] == "Selected optimization level O2:  FP16 training with FP32 batchnorm and FP32 master weights."
    assert lines[1] == ""
    assert lines[2] == "Defaults for this optimization level are:"
    assert "cast_model_type        : torch.float16" in lines
    assert lines[-1] == "loss_scale             : dynamic"


def test_environment_overrides_level_and_dtype(monkeypatch, caplog):
    monkeypatch.setenv("APEXLITE_OPT_LEVEL", "O2")
    monkeypatch.setenv("APEXLITE_DTYPE", "bfloat16")
    model, opt = model_opt()
    with caplog.at_level(logging.INFO, logger="apexlite"):
        amp.initialize(model, opt, opt_level="O1", verbosity=0)
    assert current_session().properties.opt_level == "O2"
    assert model[0].weight.dtype is torch.bfloat16
    assert "APEXLITE_OPT_LEVEL=O2" in caplog.text
    # the level's default scale becomes 1.0, which checks nothing: said, with how to keep the check
    assert current_session().properties.loss_scale == 1.0
    assert ("a step with inf/NaN grads is no longer skipped; APEXLITE_LOSS_SCALE=dynamic keeps the check"
            in caplog.text)


@pytest.mark.parametrize("option", ["keep_batchnorm_fp32", "master_weights"])
def test_hard_override_turns_an_o1_option_that_changes_nothing_into_a_warning(monkeypatch, caplog, option):
    """apex's amp._amp_state.hard_override: warn instead of raising; at O1 (an fp32 model) the option is left out."""
    monkeypatch.setattr(amp._amp_state, "hard_override", True)
    model, opt = model_opt()
    with caplog.at_level(logging.WARNING, logger="apexlite"):
        amp.initialize(model, opt, opt_level="O1", verbosity=0, **{option: True})
    assert getattr(current_session().properties, option) is None and model[0].weight.dtype is torch.float32
    assert f"Warning:  {option} must stay None with opt_level='O1'" in caplog.text


@pytest.mark.parametrize("level,option", [("O1", dict(cast_model_type=torch.float16)),
                                          ("O2", dict(patch_torch_functions=True))])
def test_hard_override_does_not_waive_a_mixture_apexlite_does_not_run(monkeypatch, level, option):
    monkeypatch.setattr(amp._amp_state, "hard_override", True)
    with pytest.raises(AmpConfigError, match="hard_override does not waive this"):
        amp.initialize(*model_opt(), opt_level=level, verbosity=0, **option)


def test_cast_model_type_alone_sets_the_dtype_and_its_loss_scale():
    model, opt = model_opt()
    amp.initialize(model, opt, opt_level="O2", cast_model_type=torch.bfloat16, verbosity=0)
    assert model[0].weight.dtype is torch.bfloat16
    assert current_session().dtype is torch.bfloat16 and current_session().properties.loss_scale == 1.0


def test_the_environment_dtype_replaces_the_scripts_cast_model_type_too(monkeypatch, caplog):
    """A script written for fp16 (cast_model_type=torch.float16) run with APEXLITE_DTYPE=bfloat16: a bf16 model
    with bf16's loss scale, not an fp16 model under a loss scale chosen for bf16."""
    monkeypatch.setenv("APEXLITE_DTYPE", "bfloat16")
    model, opt = model_opt()
    with caplog.at_level(logging.INFO, logger="apexlite"):
        amp.initialize(model, opt, opt_level="O2", cast_model_type=torch.float16, verbosity=0)
    assert model[0].weight.dtype is torch.bfloat16 and current_session().properties.cast_model_type is torch.bfloat16
    assert current_session().properties.loss_scale == 1.0
    assert "APEXLITE_DTYPE=bfloat16 also replaces the script's cast_model_type=torch.float16" in caplog.text


def test_environment_level_and_dtype_are_said_to_be_ignored_when_the_script_disables_amp(monkeypatch, caplog):
    monkeypatch.setenv("APEXLITE_OPT_LEVEL", "O3")
    monkeypatch.setenv("APEXLITE_DTYPE", "bfloat16")
    model, opt = model_opt()
    with caplog.at_level(logging.INFO, logger="apexlite"):
        amp.initialize(model, opt, opt_level="O1", enabled=False, verbosity=0)
    assert model[0].weight.dtype is torch.float32 and model.eval()(torch.randn(2, 3)).dtype is torch.float32
    assert "APEXLITE_OPT_LEVEL=O3 and APEXLITE_DTYPE=bfloat16 ignored: the script called " \
           "amp.initialize(..., enabled=False)" in caplog.text
    assert "overrides" not in caplog.text and "selects" not in caplog.text


# (the script's level, its options, the level APEXLITE_OPT_LEVEL asks for): options that level refuses
LEVEL_BOUND_OPTIONS = [
    ("O2", dict(keep_batchnorm_fp32=True), "O1"),
    ("O2", dict(master_weights=True, cast_model_type=torch.float16), "O1"),
    ("O1", dict(patch_torch_functions=True), "O2"),
]


@pytest.mark.parametrize("script_level,options,env_level", LEVEL_BOUND_OPTIONS)
def test_the_environment_level_leaves_out_options_written_for_the_scripts_own(monkeypatch, caplog, script_level,
                                                                               options, env_level):
    """A sweep runs an O2 script at O1: its O2-only options cannot apply there and are left out, saying so; the
    same options passed with that level by the script itself are still refused, as apex refused them."""
    model, opt = model_opt()
    with pytest.raises(AmpConfigError):
        amp.initialize(model, opt, opt_level=env_level, verbosity=0, **options)
    monkeypatch.setenv("APEXLITE_OPT_LEVEL", env_level)
    with caplog.at_level(logging.INFO, logger="apexlite"):
        amp.initialize(model, opt, opt_level=script_level, verbosity=0, **options)
    assert current_session().properties.opt_level == env_level
    for name in options:
        assert f"the script's {name}=" in caplog.text and f"does not apply at {env_level} and is left out" in caplog.text


def test_environment_forces_a_static_loss_scale_for_every_loss(monkeypatch, caplog):
    """APEXLITE_LOSS_SCALE replaces the script's loss_scale (migrate --verify's static-scale runs use it); a
    static scaler keeps its scale through an overflow and still skips that step."""
    monkeypatch.setenv("APEXLITE_LOSS_SCALE", "512")
    model, opt = model_opt()
    with caplog.at_level(logging.INFO, logger="apexlite"):
        amp.initialize(model, opt, opt_level="O1", loss_scale="dynamic", num_losses=2, verbosity=0)
    assert [scaler.loss_scale() for scaler in current_session().loss_scalers] == [512.0, 512.0]
    assert not any(scaler.dynamic for scaler in current_session().loss_scalers)
    before = [p.detach().clone() for p in model.parameters()]
    with amp.scale_loss(model(torch.randn(2, 3)).float().sum() * float("inf"), opt, loss_id=1) as scaled:
        scaled.backward()
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert current_session().loss_scalers[1].loss_scale() == 512.0
    assert "APEXLITE_LOSS_SCALE=512 overrides loss_scale='dynamic'" in caplog.text


@pytest.mark.parametrize("value", ["0", "-4", "inf", "nan", "big"])
def test_environment_loss_scale_must_be_valid(monkeypatch, value):
    monkeypatch.setenv("APEXLITE_LOSS_SCALE", value)
    with pytest.raises(AmpConfigError, match="APEXLITE_LOSS_SCALE must be 'dynamic' or a finite number > 0"):
        amp.initialize(*model_opt(), opt_level="O1", verbosity=0)


def test_enabled_false_is_a_pass_through():
    model, opt = model_opt()
    out = amp.initialize(model, opt, enabled=False)
    assert out == (model, opt)
    loss = model(torch.randn(2, 3)).sum()
    with amp.scale_loss(loss, opt) as scaled:
        assert scaled is loss
    assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype is torch.float32


def test_deinitialize_restores_every_patched_attribute_identically():
    before = {e.qualname: getattr(resolve(e.namespace), e.name) for e in op_entries()}
    owned_before = {e.qualname: e.name in vars(resolve(e.namespace)) for e in op_entries()}
    model, opt = model_opt()
    amp.initialize(model, opt, opt_level="O1", verbosity=0)
    assert torch.mm is not before["torch.mm"]
    amp.deinitialize()
    for entry in op_entries():
        target = resolve(entry.namespace)
        assert (entry.name in vars(target)) == owned_before[entry.qualname], entry.qualname
        if entry.namespace != "torch.Tensor":
            assert getattr(target, entry.name) is before[entry.qualname], entry.qualname
    assert "step" not in vars(opt) and not hasattr(opt, "_amp_stash")


def test_user_registrations_apply_to_the_next_o1_session():
    amp.register_float_function(torch, "sigmoid")
    amp.register_half_function(torch, "tanh")
    amp.initialize(*model_opt(), verbosity=0)
    assert torch.sigmoid(torch.ones(2, dtype=torch.float16)).dtype is torch.float32
    assert torch.tanh(torch.ones(2)).dtype is torch.float16
    amp.deinitialize()
    assert torch.tanh(torch.ones(2)).dtype is torch.float32
    with pytest.raises(ValueError, match="No function named"):
        amp.register_half_function(torch, "not_a_function")
    with pytest.raises(ValueError, match="takes the module object, not its name"):
        amp.register_float_function("torch", "sigmoid")


def test_a_registration_after_initialize_is_warned_and_waits_for_the_next_session(caplog):
    """apex ignored it silently until the next initialize; apexlite does the same, and says so."""
    amp.initialize(*model_opt(), opt_level="O1", verbosity=0)
    try:
        with caplog.at_level(logging.WARNING, logger="apexlite"):
            amp.register_half_function(torch, "tanh")
        assert "takes effect at the next amp.initialize" in caplog.text
        assert torch.tanh(torch.ones(2)).dtype is torch.float32  # not in this session
    finally:
        amp.deinitialize()
    amp.initialize(*model_opt(), opt_level="O1", verbosity=0)
    try:
        assert torch.tanh(torch.ones(2)).dtype is torch.float16
    finally:
        amp.deinitialize()


def test_decorators_cast_only_under_o1():
    @amp.half_function
    def mm(a, b):
        return a @ b

    a = torch.ones(2, 2)
    assert mm(a, a).dtype is torch.float32
    amp.initialize(*model_opt(), opt_level="O1", verbosity=0)
    assert mm(a, a).dtype is torch.float16
    amp.deinitialize()
    amp.initialize(*model_opt(), opt_level="O0", verbosity=0)
    assert mm(a, a).dtype is torch.float32


def test_initialize_warns_about_o3_fp16_with_torch_adam(caplog):
    model = torch.nn.Linear(3, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.WARNING, logger="apexlite"):
        amp.initialize(model, opt, opt_level="O3", verbosity=0)
    assert "eps=1e-08 rounds to 0" in caplog.text and "opt_level='O2'" in caplog.text
    amp.deinitialize()
    caplog.clear()
    model = torch.nn.Linear(3, 4)
    with caplog.at_level(logging.WARNING, logger="apexlite"):
        amp.initialize(model, torch.optim.Adam(model.parameters(), lr=1e-3), opt_level="O2", verbosity=0)
    assert "rounds to 0" not in caplog.text
