"""`apexlite.install()`: from one call on, `import apex` resolves to apexlite in the process and its children.

Each test runs a fresh interpreter (install() changes the process for good, by design). The children
are those launchers and libraries start: multiprocessing spawn and forkserver, subprocess Pythons,
torch.multiprocessing.spawn and a spawn-context DataLoader worker; a local `apex/` folder next to
the script (what plain Python would import) must not win in any of them.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240
COMPAT = "apexlite.compat.apex"

CHILDREN_SCRIPT = textwrap.dedent("""
    import importlib.metadata, multiprocessing, subprocess, sys
    import apexlite

    apexlite.install()
    apexlite.install()  # idempotent: nothing more changes, nothing more is logged
    import torch


    def report(queue=None):
        import apex, amp_C
        from apex.normalization.fused_layer_norm import FusedLayerNorm
        line = f"{apex.__name__} {amp_C.__name__} {importlib.metadata.version('apex')} {FusedLayerNorm.__module__}"
        if queue is None:
            return line
        queue.put(line)


    def torch_spawned(rank, queue):
        report(queue)


    class Dataset(torch.utils.data.Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, index):
            return report()


    if __name__ == "__main__":
        print("parent", report())
        for method in ("spawn", "forkserver"):
            context = multiprocessing.get_context(method)
            queue = context.Queue()
            process = context.Process(target=report, args=(queue,))
            process.start()
            print(method, queue.get(timeout=120))
            process.join()
        done = subprocess.run([sys.executable, "-c", "import apex, amp_C; print(apex.__name__, amp_C.__name__)"],
                              capture_output=True, text=True)
        print("subprocess", done.stdout.strip() or done.stderr.strip().splitlines()[-1])
        queue = torch.multiprocessing.get_context("spawn").SimpleQueue()
        torch.multiprocessing.spawn(torch_spawned, args=(queue,), nprocs=1)
        print("torch.multiprocessing.spawn", queue.get())
        loader = torch.utils.data.DataLoader(Dataset(), num_workers=1, multiprocessing_context="spawn")
        print("dataloader", next(iter(loader))[0])
""")
FULL = f"{COMPAT} apexlite.compat.amp_C 0.1+apexlite apexlite.normalization.modules"


def _env():
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    env.pop("PYTHONPATH", None)
    return env


def _run(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT_S,
                          cwd=cwd, env=_env())


@pytest.mark.slow
def test_install_reaches_this_process_and_every_kind_of_child(tmp_path):
    local = tmp_path / "apex"
    local.mkdir()
    (local / "__init__.py").write_text("raise ImportError('the local apex folder was imported')\n")
    script = tmp_path / "launched.py"
    script.write_text(CHILDREN_SCRIPT)
    result = _run(script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"parent {FULL}",
        f"spawn {FULL}",
        f"forkserver {FULL}",
        f"subprocess {COMPAT} apexlite.compat.amp_C",
        f"torch.multiprocessing.spawn {FULL}",
        f"dataloader {FULL}",
    ], result.stderr
    assert result.stderr.count("apexlite.install():") == 1, result.stderr


STATE_SCRIPT = textwrap.dedent("""
    import os, sys
    import apexlite
    from apexlite.compat import hook
    from apexlite.compat.child_path import CHILD_PATH

    apexlite.install()
    state = (list(sys.meta_path), list(sys.path), os.environ["PYTHONPATH"])
    apexlite.install()
    assert (list(sys.meta_path), list(sys.path), os.environ["PYTHONPATH"]) == state, "second call changed state"
    assert isinstance(sys.meta_path[0], hook.ApexAliasFinder)
    assert sum(isinstance(f, hook.ApexAliasFinder) for f in sys.meta_path) == 1
    assert sys.path.count(CHILD_PATH) == 1
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [CHILD_PATH, "/kept/as/well"]
    print("ok")
""")


def test_install_is_idempotent_and_keeps_the_existing_pythonpath(tmp_path):
    script = tmp_path / "state.py"
    script.write_text(STATE_SCRIPT)
    env = _env()
    env["PYTHONPATH"] = "/kept/as/well"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT_S,
                            cwd=tmp_path, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_install_after_a_real_apex_was_imported_says_so(tmp_path):
    real = tmp_path / "real" / "apex"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    script = tmp_path / "late.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(real.parent)!r})
        import apex
        import apexlite
        try:
            apexlite.install()
        except RuntimeError as error:
            print("refused:", error)
    """))
    result = _run(script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "refused: apexlite.install() must run before apex is imported" in result.stdout
    assert str(real) in result.stdout and "first cell" in result.stdout


def test_install_names_an_installed_apex_it_shadows(tmp_path):
    real = tmp_path / "real" / "apex"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    script = tmp_path / "shadow.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.append({str(real.parent)!r})
        import apexlite
        apexlite.install()
        import apex
        print(apex.__name__, hasattr(apex, "REAL"))
    """))
    result = _run(script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{COMPAT} False"
    assert f"shadowing the apex at {real / '__init__.py'}" in result.stderr
