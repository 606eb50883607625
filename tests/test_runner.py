"""`python -m apexlite run`: the script sees what `python SCRIPT` gives it, plus apex resolved to apexlite."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 90

PROBE = textwrap.dedent("""
    import os, pickle, sys
    import apex
    from apex import amp
    import amp_C

    class Payload:
        pass

    assert pickle.loads(pickle.dumps(Payload())).__class__.__name__ == "Payload"  # __main__ is this module
    print("name", __name__)
    print("argv", sys.argv)
    print("path0", sys.path[0])
    print("apex", apex.__name__, amp.__name__, amp_C.__name__)
    if len(sys.argv) > 1 and sys.argv[1] == "exit":
        sys.exit(int(sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "raise":
        def inner():
            raise ValueError("boom from script")
        inner()
""")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("APEXLITE_")}
    env.update(extra)
    return env


def apexlite_run(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "apexlite", "run", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=cwd, env=env or _env())


def test_script_sees_python_script_semantics(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    result = apexlite_run(str(script), "a", "--flag", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "name __main__" in result.stdout
    assert f"argv {[str(script), 'a', '--flag']}" in result.stdout
    assert f"path0 {tmp_path}" in result.stdout
    assert "apex apexlite.compat.apex apexlite.compat.apex.amp apexlite.compat.amp_C" in result.stdout


def test_exit_codes_and_tracebacks_propagate(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    exited = apexlite_run(str(script), "exit", "7", cwd=tmp_path)
    assert exited.returncode == 7
    raised = apexlite_run(str(script), "raise", cwd=tmp_path)
    assert raised.returncode == 1
    # torch may print warnings at import (e.g. "Failed to initialize NumPy" without numpy): read from the traceback on
    lines = raised.stderr.strip().splitlines()
    lines = lines[lines.index("Traceback (most recent call last):"):]
    assert str(script) in lines[1]  # the first frame is the script, not the runner
    assert "runpy" not in raised.stderr and "apexlite/runner.py" not in raised.stderr
    assert lines[-1] == "ValueError: boom from script"


def test_dash_m_runs_a_module(tmp_path):
    package = tmp_path / "legacy_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(PROBE)
    result = apexlite_run("-m", "legacy_pkg.train", "exit", "3", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "name __main__" in result.stdout
    assert f"argv {[str(package / 'train.py'), 'exit', '3']}" in result.stdout
    missing = apexlite_run("-m", "no_such_module_xyz", cwd=tmp_path)
    assert missing.returncode == 1 and "no_such_module_xyz" in missing.stderr


def test_run_shadows_installed_apex_only_inside_run(tmp_path):
    fake = tmp_path / "site" / "apex"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    script = tmp_path / "which.py"
    script.write_text("import apex\nprint('real' if getattr(apex, 'REAL', False) else apex.__name__)\n")
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))
    inside = apexlite_run(str(script), cwd=tmp_path, env=env)
    outside = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT_S,
                             cwd=tmp_path, env=env)
    assert inside.stdout.strip() == "apexlite.compat.apex", inside.stderr
    assert outside.stdout.strip() == "real", outside.stderr


SPAWNING_SCRIPT = textwrap.dedent("""
    import multiprocessing, subprocess, sys
    import apex
    from apex import amp


    def child(queue):
        import amp_C
        import apexlite.amp
        import apexlite.compat.amp_C
        queue.put((apex.__name__, amp.initialize is apexlite.amp.initialize, amp_C is apexlite.compat.amp_C))


    if __name__ == "__main__":
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        process = context.Process(target=child, args=(queue,))
        process.start()
        print("spawn", *queue.get(timeout=60))
        process.join()
        print("spawn exit", process.exitcode)
        probe = "import apex, amp_C; from apex.amp import scale_loss; print(apex.__name__, amp_C.__name__)"
        print("subprocess", subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip())
""")


def test_children_of_a_run_resolve_apex_too(tmp_path):
    """spawn children and new interpreters started by the script get the hook; a real apex stays shadowed."""
    fake = tmp_path / "site" / "apex"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNING_SCRIPT)
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))
    result = apexlite_run(str(script), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "spawn apexlite.compat.apex True True",
        "spawn exit 0",
        "subprocess apexlite.compat.apex apexlite.compat.amp_C",
    ], result.stderr
    outside = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT_S,
                             cwd=tmp_path, env=env)
    assert outside.returncode != 0 and "REAL" not in outside.stdout  # the fake apex has no `amp`


def test_environment_turns_fp16_script_into_bf16(tmp_path):
    script = tmp_path / "o2.py"
    script.write_text(textwrap.dedent("""
        import torch
        from apex import amp
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
        print(amp._amp_state.opt_properties.opt_level, model.weight.dtype,
              amp._amp_state.loss_scalers[0].loss_scale())
    """))
    plain = apexlite_run(str(script), cwd=tmp_path)
    assert plain.stdout.split() == ["O1", "torch.float32", "65536.0"], plain.stderr
    changed = apexlite_run(str(script), cwd=tmp_path, env=_env(APEXLITE_OPT_LEVEL="O2", APEXLITE_DTYPE="bfloat16"))
    assert changed.stdout.split() == ["O2", "torch.bfloat16", "1.0"], changed.stderr


def test_missing_script_and_usage(tmp_path, capsys):
    from apexlite import runner

    assert runner.main([str(tmp_path / "nope.py")]) == 2
    assert "can't open file" in capsys.readouterr().err
    assert runner.main([]) == 2
    assert "usage: python -m apexlite run" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["train.ipynb", "train_notebook_without_suffix"])
def test_a_notebook_is_refused_with_what_to_do(tmp_path, capsys, name):
    """A notebook's JSON parses as a Python expression: run exited 0 having run nothing (a user's review)."""
    from apexlite import runner

    notebook = tmp_path / name
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "print('ran')", "metadata": {},
                                               "outputs": [], "execution_count": None}],
                                    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert runner.main([str(notebook)]) == 2
    captured = capsys.readouterr()
    assert "is a Jupyter notebook, which Python does not run" in captured.err and "ran" not in captured.out


def test_a_double_dash_before_the_script_is_taken_as_python_takes_it(tmp_path):
    script = tmp_path / "args.py"
    script.write_text("import sys\nprint(sys.argv[1:])\n")
    result = apexlite_run("--", str(script), "--flag", "x", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "['--flag', 'x']", result.stderr
    assert apexlite_run("--", cwd=tmp_path).returncode == 2


def test_dash_m_runs_apexs_launcher_as_apexlite_has_it(tmp_path):
    """`run -m apex.parallel.multiproc main.py` (old launch lines): apexlite's module runs and says what to use
    instead; it failed inside runpy (the alias loader had no code to give)."""
    result = apexlite_run("-m", "apex.parallel.multiproc", "main.py", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "apex.parallel.multiproc is not supported by apexlite. Launch with `torchrun --nproc-per-node=N -m apexlite "
        "run main.py ...` (each process reads RANK/WORLD_SIZE/LOCAL_RANK from the environment) instead of "
        "`python -m apex.parallel.multiproc`.")
    assert "Traceback" not in result.stderr
