"""Every legacy apex import path resolves (through the hook) to apexlite, and unsupported names raise at use."""
import importlib
import subprocess
import sys
import textwrap

import pytest
import torch

from apexlite.compat import ApexliteUnsupportedError, apex_aliases

LEGACY_NAMES = {
    "apex": ["amp", "optimizers", "parallel", "fp16_utils", "normalization", "multi_tensor_apply",
             "DeprecatedFeatureWarning", "deprecated_warning"],
    "apex.amp": ["init", "initialize", "scale_loss", "disable_casts", "state_dict", "load_state_dict",
                 "master_params", "half_function", "float_function", "promote_function",
                 "register_half_function", "register_float_function", "register_promote_function",
                 "_amp_state", "__version__"],
    "apex.amp.frontend": ["initialize", "state_dict", "load_state_dict", "Properties", "opt_levels",
                          "O0", "O1", "O2", "O3"],
    "apex.amp.handle": ["scale_loss", "disable_casts", "AmpHandle", "NoOpHandle"],
    "apex.amp.scaler": ["LossScaler", "scale_check_overflow_python", "axpby_check_overflow_python"],
    "apex.amp._amp_state": ["_amp_state", "master_params", "maybe_print", "warn_or_err", "AmpState"],
    "apex.amp.amp": ["init", "register_float_function"],
    "apex.optimizers": ["FusedAdam", "FusedSGD", "FusedLAMB", "FusedNovoGrad", "FusedAdagrad"],
    "apex.parallel": ["DistributedDataParallel", "Reducer", "SyncBatchNorm", "convert_syncbn_model",
                      "create_syncbn_process_group", "ReduceOp", "LARC"],
    "apex.parallel.LARC": ["LARC"],
    "apex.fp16_utils": ["FP16_Optimizer", "network_to_half", "FP16_Module", "FP16Model", "prep_param_lists",
                        "model_grads_to_master_grads", "master_params_to_model_params", "tofp16",
                        "BN_convert_float", "to_python_float", "clip_grad_norm", "convert_module",
                        "convert_network", "LossScaler", "DynamicLossScaler"],
    "apex.normalization": ["FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm",
                           "fused_layer_norm"],
    "apex.normalization.fused_layer_norm": [
        "FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm", "fused_layer_norm",
        "fused_layer_norm_affine", "fused_rms_norm", "fused_rms_norm_affine", "mixed_dtype_fused_layer_norm_affine",
        "mixed_dtype_fused_rms_norm_affine", "FusedLayerNormAffineFunction", "FusedRMSNormAffineFunction",
        "FusedLayerNormAffineMixedDtypesFunction", "FusedRMSNormAffineMixedDtypesFunction", "FusedLayerNormFunction",
        "FusedRMSNormFunction"],
    "apex.multi_tensor_apply": ["multi_tensor_applier", "MultiTensorApply"],
    "amp_C": ["multi_tensor_scale", "multi_tensor_axpby", "multi_tensor_l2norm"],
}


@pytest.mark.parametrize("module_name", sorted(LEGACY_NAMES))
def test_legacy_module_exports(module_name):
    with apex_aliases():
        module = importlib.import_module(module_name)
        missing = [name for name in LEGACY_NAMES[module_name] if not hasattr(module, name)]
    assert not missing, f"{module_name} lacks {missing}"


def test_aliases_are_the_compat_modules_and_state_object_survives_submodule_import():
    import apexlite.compat.apex.amp as compat_amp
    from apexlite.amp.legacy_state import legacy_flags

    with apex_aliases():
        import apex.amp
        import apex.amp._amp_state  # noqa: F401  (must not rebind apex.amp._amp_state to the module)
        from apex.amp import _amp_state

        assert apex.amp is compat_amp
        assert sys.modules["apex.amp"] is compat_amp
        assert apex.amp._amp_state is legacy_flags
        assert _amp_state is legacy_flags
        assert apex.amp.initialize is importlib.import_module("apexlite.amp").initialize
    assert "apex" not in sys.modules and "apex.amp" not in sys.modules


def test_unsupported_areas_import_and_raise_at_use():
    with apex_aliases():
        from apex.contrib.xentropy import SoftmaxCrossEntropyLoss
        from apex.RNN import LSTM
        from apex import amp

        with pytest.raises(ApexliteUnsupportedError, match="cross_entropy"):
            SoftmaxCrossEntropyLoss()
        with pytest.raises(ApexliteUnsupportedError, match="torch.nn.LSTM"):
            LSTM(4, 4, 1)
        assert amp.init(enabled=False).is_active() is False
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("apex.no_such_module")


def test_legacy_training_loop_through_aliases_matches_amp():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with apex_aliases():
        from apex import amp

        try:
            model, opt = amp.initialize(model, opt, opt_level="O2", loss_scale=128.0, verbosity=0)
            assert amp._amp_state.loss_scalers[0].loss_scale() == 128.0
            assert amp._amp_state.opt_properties.master_weights is True
            assert model.weight.dtype is torch.float16
            with amp.scale_loss(model(torch.randn(3, 4)).float().sum(), opt) as scaled:
                scaled.backward()
            opt.step()
            assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 128.0, "unskipped": 1}
        finally:
            amp.deinitialize()


def test_scaler_python_helpers():
    from apexlite.compat.apex.amp.scaler import axpby_check_overflow_python, scale_check_overflow_python

    model_grad, master = torch.tensor([1.0, 2.0]).half(), torch.zeros(2)
    assert scale_check_overflow_python(model_grad, master, 0.5, check_overflow=True) is False
    torch.testing.assert_close(master, torch.tensor([0.5, 1.0]))
    assert scale_check_overflow_python(torch.tensor([float("inf")]), torch.zeros(1), 1.0, True) is True
    stashed = torch.tensor([10.0, 10.0])
    assert axpby_check_overflow_python(model_grad, stashed, master, 2.0, 1.0) is False
    torch.testing.assert_close(master, torch.tensor([12.0, 14.0]))


def test_importing_apexlite_never_shadows_an_installed_apex(tmp_path):
    fake = tmp_path / "apex"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL_APEX = True\n")
    code = textwrap.dedent("""
        import apexlite, apexlite.compat, apexlite.runner, apexlite.compat.apex
        import apex
        assert getattr(apex, "REAL_APEX", False), apex
        print("real apex kept")
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "real apex kept" in result.stdout


CONSISTENCY_PROBE = textwrap.dedent("""
    import sys, types
    from apexlite.compat import hook
    hook.install()
    exec(sys.argv[1])
    problems = []
    for name, module in list(sys.modules.items()):
        target = hook.target_name(name)
        if target is not None and sys.modules.get(target) is not module:
            problems.append(f"{name} is not {target}")
        parent, _, child = name.rpartition(".")
        attribute = getattr(sys.modules[parent], child, None) if name.startswith("apexlite.compat.") else None
        # (a package attribute may be a class or object of the same name, as in apex: LARC, _amp_state)
        if isinstance(attribute, types.ModuleType) and attribute is not module:
            problems.append(f"{name} was loaded twice: {parent}.{child} is another module object")
    print(problems or "consistent")
""")


@pytest.mark.parametrize("first_import", ["import amp_C", "import apex", "from apex import amp",
                                          "import apex.optimizers", "from apex.amp import _amp_state",
                                          "import apex.fp16_utils; import amp_C"])
def test_each_compat_module_loads_once_whichever_legacy_name_comes_first(first_import):
    """A fresh process: the legacy name, the compat name and the package attribute are one module object."""
    result = subprocess.run([sys.executable, "-c", CONSISTENCY_PROBE, first_import], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "consistent"
