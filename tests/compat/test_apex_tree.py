"""The apex tree table: its invariants, the facts the issue names, lazy loading, and its generator.

The generator is run end to end on a small apex-shaped source tree (no apex checkout or network needed):
it reads names with ast, imports each module python-only in a forked process, and keeps apexlite's
columns of an existing table across a regeneration.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apexlite.compat import apex_tree

ROOT = Path(__file__).resolve().parents[2]
TREE = apex_tree.tree()


def test_every_row_has_a_decided_status():
    undecided = [name for name, row in TREE.rows.items() if row.status == apex_tree.NEW]
    assert not undecided, f"decide the status of these new rows in apex_tree.tsv: {undecided}"
    assert all(row.status in apex_tree.STATUSES + ("",) for row in TREE.rows.values())
    assert all(TREE.status(name)[0] in apex_tree.STATUSES for name in TREE.rows)


def test_what_apex_imported_apexlite_imports_and_what_it_refused_apexlite_refuses_or_implements():
    for row in TREE.modules():
        status = TREE.status(row.name)[0]
        if row.apex_imports:
            assert status != apex_tree.REFUSED, row.name
        elif status != apex_tree.REFUSED:  # apexlite implements what apex could not import: extension modules
            assert status in apex_tree.WORKING and "." not in row.name, row.name


def test_every_unsupported_or_refused_name_names_an_alternative():
    for name in TREE.rows:
        status, note = TREE.status(name)
        if status in (apex_tree.UNSUPPORTED, apex_tree.REFUSED):
            assert len(note) > 15, name


def test_re_exports_point_at_rows():
    for row in TREE.rows.values():
        if row.same_as and not row.is_module:
            assert row.same_as in TREE.rows, row.name
            assert TREE.rows[row.same_as].same_as == "" or TREE.rows[row.same_as].is_module, row.name


@pytest.mark.parametrize("name,kind", [
    ("apex.normalization.fused_layer_norm", "module"),
    ("apex.normalization.fused_layer_norm.FusedLayerNormAffineFunction", "class"),
    ("apex.parallel.distributed.flat_dist_call", "function"),
    ("apex.parallel.sync_batchnorm_kernel", "module"),
    ("apex.multi_tensor_apply.multi_tensor_apply", "module"),
    ("apex.multi_tensor_apply.multi_tensor_applier", "object"),
    ("apex.amp.lists.torch_overrides.FP32_FUNCS", "constant"),
    ("apex.fp16_utils.fp16_optimizer", "module"),
    ("apex.fp16_utils.fp16util.model_grads_to_master_grads", "function"),
    ("apex.optimizers.fused_adam.FusedAdam", "class"),
    ("apex.contrib.layer_norm.layer_norm.FastLayerNormFN", "class"),
    ("amp_C.multi_tensor_adam_capturable_master", "function"),
])
def test_the_paths_real_code_uses_are_rows_of_the_right_kind(name, kind):
    assert TREE.row(name).kind == kind


def test_amp_c_lists_apexs_kernels_and_apex_amp_state_is_an_object_on_its_package():
    kernels = {row.name for row in TREE.members("amp_C")}
    assert len(kernels) == 17 and "amp_C.update_scale_hysteresis" in kernels
    assert TREE.row("apex.amp._amp_state").same_as == "apex.amp._amp_state._amp_state"
    assert TREE.status("apex.contrib.xentropy")[0] == apex_tree.REFUSED
    assert TREE.row("apex.contrib.xentropy").apex == "ModuleNotFoundError: No module named 'xentropy_cuda'"


LAZY = textwrap.dedent("""
    import sys, torch
    from apexlite.compat import apex_tree, hook
    hook.install()
    import apex, amp_C
    from apex import amp
    from apex.optimizers import FusedAdam
    from apex.parallel import DistributedDataParallel
    from apex.fp16_utils import FP16_Optimizer
    model = torch.nn.Linear(2, 2)
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O1", verbosity=0)
    amp.deinitialize()
    print("table read:", apex_tree.tree.cache_info().currsize)
    import apex.transformer
    print("table read:", apex_tree.tree.cache_info().currsize)
""")


def test_the_table_is_read_only_when_a_script_reaches_beyond_apexlites_own_modules():
    result = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["table read: 0", "table read: 1"]


def test_apexlite_run_does_not_read_the_table_for_a_plain_amp_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys\nfrom apex import amp\nimport apex.optimizers\n"
                      "tree = sys.modules.get('apexlite.compat.apex_tree')\n"
                      "print('read' if tree is not None and tree.tree.cache_info().currsize else 'not read')\n")
    result = subprocess.run([sys.executable, "-m", "apexlite", "run", str(script)], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "not read"


# --- the generator, end to end on a small apex-shaped tree ----------------------------------------------------

FAKE_APEX = {
    "apex/__init__.py": "from . import good\n__all__ = ['good']\n",
    "apex/good.py": textwrap.dedent("""
        import torch
        from torch.nn import Linear
        from .pkg.impl import exported as reexported
        def public_fn():
            pass
        class PublicClass:
            pass
        CONSTANT = 3
        _private = 1
        try:
            from fast_ext_cuda import fast
        except ImportError:
            fast = None
    """),
    "apex/bad/__init__.py": "import missing_cuda_ext\nfrom .impl import Thing\n",
    "apex/bad/impl.py": "class Thing:\n    pass\n",
    "apex/pkg/__init__.py": "from .impl import *\n",
    "apex/pkg/impl.py": "__all__ = ['exported']\ndef exported():\n    pass\ndef hidden():\n    pass\n",
    "apex/pkg/test.py": "raise SystemExit('a test file is never imported')\n",
    "apex/tests/test_thing.py": "raise SystemExit('tests are never imported')\n",
    "apex/examples/example.py": "raise SystemExit('examples are never imported')\n",
    "apex/contrib/csrc/build_helper.py": "raise SystemExit('build helpers are never imported')\n",
    "csrc/amp_C_frontend.cpp": 'm.def("multi_tensor_scale", &f, "doc");\n  m.def("multi_tensor_norm", &g);\n',
    "csrc/flat_one.cpp": 'm.def("flatten", &f);\n',
    "csrc/flat_two.cpp": 'm.def("unflatten", &g);\n',
    "setup.py": textwrap.dedent("""
        if "--cpp_ext" in sys.argv:
            ext_modules.append(CppExtension("flat_C", ["csrc/flat_*.cpp"]))
        ext_modules.append(CUDAExtension(name="amp_C", sources=["csrc/amp_C_frontend.cpp"] + ["csrc/kernel.cu"]))
    """),
}
OLD_TABLE = {  # name -> (status, note), plus a hand-written row and one that no longer exists
    "apex.good.public_fn": ("differs", "apexlite's note survives"),
    "apex.bad": ("refused", "use the torch op"),
    "apex.old_module": ("unsupported", "a row apex no longer has"),
}


def test_generator_reads_the_tree_and_keeps_apexlites_columns(tmp_path):
    source = tmp_path / "apex_src"
    for relative, text in FAKE_APEX.items():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_text(text)
    table = tmp_path / "apex_tree.tsv"
    old = [dict(name=name, kind="function", apex="", status=status, same_as="", note=note)
           for name, (status, note) in OLD_TABLE.items()]
    old.append(dict(name="apex.good.OldName", kind="class", apex="absent at e13873de (kept by hand)", status="supported",
                    same_as="", note="hand-written"))
    lines = ["\t".join(apex_tree.COLUMNS)] + ["\t".join(row[c] for c in apex_tree.COLUMNS) for row in old]
    table.write_text("\n".join(lines) + "\n")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_apex_tree.py"), str(source), "--python",
                             sys.executable, "--out", str(table), "--jobs", "2"], capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 0, result.stderr
    assert "dropped (no longer in apex's source): apex.old_module" in result.stderr
    rows = {row.name: row for row in apex_tree.parse(table.read_text())}
    facts = {name: (row.kind, row.apex, row.same_as) for name, row in rows.items()}
    assert facts == {
        "apex": ("package", "imports", ""),
        "apex.good": ("module", "imports", ""),
        "apex.good.public_fn": ("function", "", ""),
        "apex.good.PublicClass": ("class", "", ""),
        "apex.good.CONSTANT": ("constant", "", ""),
        "apex.good.fast": ("constant", "", ""),  # bound by apex's fallback in a try block
        "apex.good.reexported": ("function", "", "apex.pkg.impl.exported"),
        "apex.good.OldName": ("class", "absent at e13873de (kept by hand)", ""),
        "apex.bad": ("package", "ModuleNotFoundError: No module named 'missing_cuda_ext'", ""),
        "apex.bad.Thing": ("class", "", "apex.bad.impl.Thing"),
        "apex.bad.impl": ("module", "ModuleNotFoundError: No module named 'missing_cuda_ext'", ""),
        "apex.bad.impl.Thing": ("class", "", ""),
        "apex.pkg": ("package", "imports", ""),
        "apex.pkg.exported": ("function", "", "apex.pkg.impl.exported"),
        "apex.pkg.impl": ("module", "imports", ""),
        "apex.pkg.impl.exported": ("function", "", ""),
        "apex.pkg.impl.hidden": ("function", "", ""),
        "amp_C": ("module", "ModuleNotFoundError: No module named 'amp_C'", ""),
        "amp_C.multi_tensor_norm": ("function", "", ""),
        "amp_C.multi_tensor_scale": ("function", "", ""),
        "flat_C": ("module", "ModuleNotFoundError: No module named 'flat_C'", ""),  # setup.py's extensions
        "flat_C.flatten": ("function", "", ""),
        "flat_C.unflatten": ("function", "", ""),
    }
    kept = {name: (row.status, row.note) for name, row in rows.items() if row.status != apex_tree.NEW}
    assert kept == {"apex.good.public_fn": OLD_TABLE["apex.good.public_fn"], "apex.bad": OLD_TABLE["apex.bad"],
                    "apex.good.OldName": ("supported", "hand-written")}
