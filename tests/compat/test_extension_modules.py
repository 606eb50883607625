"""apex's compiled extensions as top-level modules (`fused_layer_norm_cuda`, `syncbn`, ...): what apexlite
provides and refuses agrees with its tree table; under the hook they resolve to apexlite's modules, or raise
apex's ModuleNotFoundError naming the alternative; real code of the era (Megatron-LM 2022-23's fused layer
norm, fused softmax and gradient accumulation fusion; fairseq's fused_adam_cuda probe) runs through `apexlite run` and `apexlite.install()` (the alias:
tests/compat/test_alias.py); and none of these names exists in a process that did not opt in."""
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apexlite.compat import apex_aliases, apex_tree
from apexlite.compat._unsupported import is_placeholder
from apexlite.compat.child_path import CHILD_PATH
from apexlite.compat.child_path.sitecustomize import LEGACY_TOP_LEVEL, REFUSED_EXTENSIONS
from apexlite.compat.generic import advice
from apexlite.compat.install import is_stand_in

TREE = apex_tree.tree()
SCRIPTS = Path(__file__).parent / "_scripts"
PROVIDED = LEGACY_TOP_LEVEL[1:]  # after `apex` itself
TOP_LEVEL_ROWS = [row for row in TREE.modules() if "." not in row.name and row.name != "apex"]
TIMEOUT_S = 180


def test_the_lists_of_names_agree_with_the_table():
    working = sorted(row.name for row in TOP_LEVEL_ROWS if TREE.status(row.name)[0] in apex_tree.WORKING)
    refused = sorted(row.name for row in TOP_LEVEL_ROWS if TREE.status(row.name)[0] == apex_tree.REFUSED)
    assert sorted(PROVIDED) == working
    assert sorted(REFUSED_EXTENSIONS) == refused
    assert len(TOP_LEVEL_ROWS) == len(working) + len(refused)


@pytest.mark.parametrize("name", PROVIDED)
def test_a_provided_module_has_every_working_function_of_its_row_and_nothing_else(name):
    module = importlib.import_module(f"apexlite.compat.{name}")
    rows = TREE.members(name)
    working = {row.name.rpartition(".")[2] for row in rows if TREE.status(row.name)[0] in apex_tree.WORKING}
    assert set(module.__all__) == working
    for function in working:
        assert callable(getattr(module, function)) and not is_placeholder(getattr(module, function)), function


def test_children_started_without_site_find_a_stand_in_for_every_provided_name():
    stand_ins = {path.stem if path.suffix == ".py" else path.name: path for path in Path(CHILD_PATH).iterdir()
                 if path.name != "__init__.py" and (path.suffix == ".py" or (path / "__init__.py").is_file())}
    stand_ins.pop("sitecustomize")
    assert sorted(stand_ins) == sorted(LEGACY_TOP_LEVEL)
    for name, path in stand_ins.items():
        assert is_stand_in(str(path if path.suffix == ".py" else path / "__init__.py")), name


@pytest.mark.parametrize("name", PROVIDED)
def test_under_the_hook_a_provided_name_is_apexlites_module(name):
    with apex_aliases():
        assert importlib.import_module(name) is importlib.import_module(f"apexlite.compat.{name}")
        assert sys.modules[name].__name__ == f"apexlite.compat.{name}"
    assert name not in sys.modules


@pytest.mark.parametrize("name", REFUSED_EXTENSIONS)
def test_under_the_hook_a_refused_name_raises_apexs_error_with_the_alternative(name):
    with apex_aliases():
        with pytest.raises(ModuleNotFoundError) as caught:
            importlib.import_module(name)
    assert caught.value.name == name
    assert str(caught.value).startswith(f"No module named {name!r}: apexlite does not implement")
    assert advice(TREE.status(name)[1]) in str(caught.value)
    assert name not in sys.modules


def test_a_real_build_of_a_refused_extension_is_left_to_the_import_system(tmp_path, monkeypatch):
    (tmp_path / "xentropy_cuda.py").write_text("BUILT = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with apex_aliases():
        try:
            assert importlib.import_module("xentropy_cuda").BUILT is True
        finally:
            sys.modules.pop("xentropy_cuda", None)


def test_refused_apex_modules_that_needed_a_provided_extension_say_so():
    with apex_aliases():
        with pytest.raises(ModuleNotFoundError) as caught:
            importlib.import_module("apex.parallel.optimized_sync_batchnorm")
    message = str(caught.value)
    assert "apex needed its compiled extension syncbn here, which apexlite provides" in message
    assert "apex.parallel.SyncBatchNorm" in message and caught.value.name == "apex.parallel.optimized_sync_batchnorm"


NOT_OPTED_IN = textwrap.dedent("""
    import importlib, importlib.util, sys
    import apexlite, apexlite.compat, apexlite.compat.hook, apexlite.runner
    from apexlite.compat import fused_layer_norm_cuda, syncbn, amp_C, apex_aliases
    from apexlite.compat.child_path.sitecustomize import LEGACY_TOP_LEVEL, REFUSED_EXTENSIONS
    with apex_aliases():
        importlib.import_module("fused_layer_norm_cuda")
    found = []
    for name in LEGACY_TOP_LEVEL + REFUSED_EXTENSIONS:
        if name in sys.modules or importlib.util.find_spec(name) is not None:
            found.append(name)
            continue
        try:
            importlib.import_module(name)
            found.append(name)
        except ModuleNotFoundError as error:
            if str(error) != f"No module named {name!r}":
                found.append(f"{name}: {error}")
    print(found or "none")
""")


def test_no_legacy_name_resolves_in_a_process_that_did_not_opt_in(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    env.pop("PYTHONPATH", None)
    result = subprocess.run([sys.executable, "-c", NOT_OPTED_IN], capture_output=True, text=True, timeout=TIMEOUT_S,
                            cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"


def _script(script, way, cwd):
    """The script's JSON report, run under `apexlite run` or calling apexlite.install() itself."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    env.pop("PYTHONPATH", None)
    path = str(SCRIPTS / script)
    command = ["-m", "apexlite", "run", path] if way == "run" else [path, "--install"]
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd,
                            env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# Megatron's uses of the extensions: (check, largest difference allowed from the fp32 torch reference)
MEGATRON_LIMITS = {"layer_norm": 1e-5, "grad_accumulation": 1e-5, "causal_softmax": 2e-3, "masked_softmax": 2e-3}
MEGATRON_MODULES = ["apexlite.compat.fused_layer_norm_cuda", "apexlite.compat.fused_weight_gradient_mlp_cuda",
                    "apexlite.compat.scaled_masked_softmax_cuda", "apexlite.compat.scaled_upper_triang_masked_softmax_cuda"]


def check_megatron_report(report):
    """The modules that answered are apexlite's, and every result is torch's within its limit."""
    assert report["modules"] == MEGATRON_MODULES, report
    assert report["differences"].keys() == MEGATRON_LIMITS.keys()
    for check, limit in MEGATRON_LIMITS.items():
        assert report["differences"][check] <= limit, (check, report)


@pytest.mark.slow
@pytest.mark.parametrize("way", ["run", "install"])
def test_megatron_eras_fused_kernels_match_torch(way, tmp_path):
    check_megatron_report(_script("megatron_fused_kernels.py", way, tmp_path))


@pytest.mark.slow
def test_fairseqs_fused_adam_probe_finds_fused_adam_cuda_and_steps_like_torch_adam(tmp_path):
    report = _script("fairseq_fused_adam.py", "run", tmp_path)  # install() and the alias: the Megatron script
    assert report["class"] == "FusedAdamV1" and report["module"] == "apexlite.compat.fused_adam_cuda"
    assert report["difference"] <= 1e-5, report
