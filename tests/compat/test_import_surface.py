"""apex's whole module tree (apexlite/compat/apex_tree.tsv) walked against the modules, through the hook.

Each area runs in a fresh interpreter (tests/compat/_scripts/walk_apex_tree.py), since importing one
module must not make another work by accident; each table row is then one test. Rows for names other
helpers implement are marked xfail until their code lands (the lead removes the marks at merge).
"""
import importlib
import importlib.util
import json
import subprocess
import sys
import textwrap
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from apexlite.compat import ApexliteUnsupportedError, apex_aliases, apex_tree

WALKER = Path(__file__).parent / "_scripts" / "walk_apex_tree.py"
_SPEC = importlib.util.spec_from_file_location("walk_apex_tree", WALKER)
area_of = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(area_of)
area_of = area_of.area_of

TREE = apex_tree.tree()
ROWS = sorted(TREE.rows)

@lru_cache(maxsize=None)
def _walk(area):
    result = subprocess.run([sys.executable, str(WALKER), area], capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULTS ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.mark.parametrize("name", ROWS)
def test_table_row_holds_under_the_hook(name):
    results = _walk(area_of(name))
    assert name in results, f"{name} was not walked"
    assert results[name] == "", f"{name}: {results[name]}"


def test_the_walk_covers_every_area_and_every_kind_of_row():
    statuses = {TREE.status(name)[0] for name in ROWS}
    assert statuses == set(apex_tree.STATUSES)
    assert {"class", "function", "object", "constant", "submodule", "module", "package"} <= {
        TREE.row(name).kind for name in ROWS}
    assert len({area_of(name) for name in ROWS}) >= 15


@pytest.mark.parametrize("name", ["apex.no_such_module", "apex.amp.no_such", "apex.contrib.no_such",
                                  "apex.transformer.no_such", "amp_C.no_such"])
def test_paths_apex_never_had_fail_with_the_normal_error(name):
    with apex_aliases():
        with pytest.raises(ModuleNotFoundError) as caught:
            importlib.import_module(name)
    assert caught.value.name == name and str(caught.value).startswith(f"No module named {name!r}")


FEATURE_DETECTION = textwrap.dedent("""
    from apexlite.compat import hook
    hook.install()
    try:  # Megatron-LM's detection of apex's persistent layer norm
        from apex.contrib.layer_norm.layer_norm import FastLayerNormFN
        HAVE_PERSIST_LAYER_NORM = True
    except ImportError as error:
        HAVE_PERSIST_LAYER_NORM = False
        print(type(error).__mro__[1].__name__, error.name)
    try:
        import apex.contrib.xentropy as xentropy
    except ModuleNotFoundError:
        xentropy = None
    import importlib.util
    print(HAVE_PERSIST_LAYER_NORM, xentropy, importlib.util.find_spec("apex.mlp") is not None)
""")


def test_feature_detection_takes_the_fallback_as_with_apex_built_without_extensions():
    result = subprocess.run([sys.executable, "-c", FEATURE_DETECTION], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # the error is a ModuleNotFoundError naming the missing extension, as apex's was
    assert result.stdout.split("\n")[:2] == ["ModuleNotFoundError fast_layer_norm", "False None True"]


def test_refused_module_message_names_what_is_missing_and_the_alternative():
    with apex_aliases():
        with pytest.raises(ModuleNotFoundError) as caught:
            import apex.contrib.xentropy  # noqa: F401
    message = str(caught.value)
    assert message.startswith("No module named 'xentropy_cuda': apex.contrib.xentropy needs it")
    assert "torch.nn.functional.cross_entropy" in message and "label_smoothing" in message


def test_a_submodule_reached_as_an_attribute_is_in_sys_modules_in_a_fresh_interpreter():
    """apex's __init__ imported apex.transformer; apexlite loads it on attribute access and names it in
    sys.modules then (it did not, so the test below passed only after another test had imported it)."""
    code = textwrap.dedent("""
        import sys
        from apexlite.compat import apex_aliases
        with apex_aliases():
            import apex
            transformer = apex.transformer
            assert sys.modules["apex.transformer"] is transformer
        assert "apex.transformer" not in sys.modules
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


def test_placeholder_modules_are_reachable_as_apex_had_them():
    with apex_aliases():
        import apex

        transformer = apex.transformer  # apex's __init__ imported it
        assert transformer is sys.modules["apex.transformer"] is importlib.import_module("apex.transformer")
        from apex.transformer import tensor_parallel
        from apex.transformer.tensor_parallel.layers import ColumnParallelLinear

        assert tensor_parallel.ColumnParallelLinear is ColumnParallelLinear  # a re-export is the same object
        with pytest.raises(ApexliteUnsupportedError, match="Megatron-Core"):
            ColumnParallelLinear(4, 4)
        assert "ColumnParallelLinear" in dir(tensor_parallel)
        with pytest.raises(AttributeError):
            tensor_parallel.NoSuchName


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
                                          "import apex.fp16_utils; import amp_C",
                                          "import fused_layer_norm_cuda; import apex.normalization; import syncbn"])
def test_each_compat_module_loads_once_whichever_legacy_name_comes_first(first_import):
    """A fresh process: the legacy name, the compat name and the package attribute are one module object."""
    result = subprocess.run([sys.executable, "-c", CONSISTENCY_PROBE, first_import], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "consistent"
