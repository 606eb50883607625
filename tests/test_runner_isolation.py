"""`apexlite run` leaves the embedding process as it found it, and its children resolve apex as it does.

Written as the probes that found the problems: `runner.main()` called in-process used to leave its
stand-in folder on `sys.path`/`PYTHONPATH`; a local `apex/` folder next to the script shadowed
apexlite in spawned children and new interpreters, but not in the run's own process.
"""
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apexlite import runner

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


def _snapshot():
    return dict(argv=(sys.argv, list(sys.argv)), path=(sys.path, list(sys.path)),
                meta_path=(sys.meta_path, list(sys.meta_path)), pythonpath=os.environ.get("PYTHONPATH"),
                apex_modules=sorted(name for name in sys.modules if name.split(".")[0] in ("apex", "amp_C")))


def _assert_same(before, after):
    for key in ("argv", "path", "meta_path"):
        assert after[key][0] is before[key][0], f"sys.{key} was rebound"
        assert after[key][1] == before[key][1], f"sys.{key} changed"
    assert after["pythonpath"] == before["pythonpath"]
    assert after["apex_modules"] == before["apex_modules"] == []


IN_PROCESS_SCRIPT = textwrap.dedent("""
    import importlib.metadata, sys
    import apex
    from apex import amp
    sys.path.insert(0, "/script/added/this")
    sys.argv.append("script-added")
    print("inside", apex.__name__, amp.__name__, importlib.metadata.version("apex"))
    if len(sys.argv) > 2 and sys.argv[1] == "exit":
        sys.exit(int(sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "raise":
        raise RuntimeError("script failed")
""")


@pytest.mark.parametrize("pythonpath", [None, "/some/where/else"])
@pytest.mark.parametrize("mode,expected", [("ok", 0), ("raise", 1), ("exit", 3)])
def test_in_process_main_restores_interpreter_state(tmp_path, monkeypatch, capsys, pythonpath, mode, expected):
    if pythonpath is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", pythonpath)
    script = tmp_path / "legacy.py"
    script.write_text(IN_PROCESS_SCRIPT)
    argv = [str(script)] + {"ok": [], "raise": ["raise"], "exit": ["exit", "3"]}[mode]
    before = _snapshot()
    if mode == "exit":
        with pytest.raises(SystemExit) as exited:
            runner.main(argv)
        status = exited.value.code
    else:
        status = runner.main(argv)
    _assert_same(before, _snapshot())
    assert status == expected
    assert "inside apexlite.compat.apex apexlite.compat.apex.amp 0.1+apexlite" in capsys.readouterr().out
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("apex")  # nothing claims apex once the run is over


def test_in_process_module_run_restores_interpreter_state(tmp_path, monkeypatch, capsys):
    (tmp_path / "legacy_module.py").write_text(IN_PROCESS_SCRIPT)
    monkeypatch.chdir(tmp_path)
    before = _snapshot()
    assert runner.main(["-m", "legacy_module"]) == 0
    _assert_same(before, _snapshot())
    sys.modules.pop("legacy_module", None)
    assert "inside apexlite.compat.apex" in capsys.readouterr().out


def test_finders_added_by_the_scripts_libraries_stay_and_an_embedding_hook_survives(tmp_path, capsys):
    """Only the run's own apexlite finder goes: a library's finder serves modules that remain loaded."""
    from apexlite.compat import apex_aliases

    script = tmp_path / "adds_finder.py"
    script.write_text(textwrap.dedent("""
        import sys, importlib.abc
        class LibraryFinder(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                return None
        sys.meta_path.append(LibraryFinder())
        import apex
        print("ran", apex.__name__)
    """))
    with apex_aliases() as embedding_finder:
        before = list(sys.meta_path)
        assert runner.main([str(script)]) == 0
        after = list(sys.meta_path)
        assert after[:len(before)] == before and embedding_finder in after
        assert [type(finder).__name__ for finder in after[len(before):]] == ["LibraryFinder"]
        sys.meta_path.remove(after[-1])
    assert "ran apexlite.compat.apex" in capsys.readouterr().out


CHILDREN_SCRIPT = textwrap.dedent("""
    import multiprocessing, os, subprocess, sys

    METADATA_FIRST = ("import builtins, importlib.metadata, sys; version = importlib.metadata.version('apex'); "
                      "print(version, 'torch' in sys.modules, 'apexlite' in sys.modules, "
                      "getattr(builtins, 'SITE_CUSTOMIZED', 'no'), end=' '); import apex; print(apex.__name__)")


    def spawned(queue):
        import apex
        queue.put(apex.__name__)


    if __name__ == "__main__":
        import apex
        print("parent", apex.__name__)
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        process = context.Process(target=spawned, args=(queue,))
        process.start()
        print("spawn", queue.get(timeout=90))
        process.join()
        here = os.path.dirname(os.path.abspath(__file__))
        for label, command in [("script", [sys.executable, os.path.join(here, "child.py")]),
                               ("dash-c", [sys.executable, "-c", METADATA_FIRST])]:
            done = subprocess.run(command, capture_output=True, text=True, cwd=here)
            print(label, done.stdout.strip() or done.stderr.strip().splitlines()[-1])
""")


def test_children_resolve_apex_like_the_parent_despite_a_local_apex_folder(tmp_path):
    """spawn children and new interpreters (a script next to the local folder, `-c` run there) get apexlite;
    a child loads neither torch nor apexlite until it imports apex, and the site's sitecustomize still runs."""
    local = tmp_path / "apex"
    local.mkdir()
    (local / "__init__.py").write_text("LOCAL = True\n")
    (tmp_path / "child.py").write_text(
        "import importlib.metadata\nimport apex\nprint(apex.__name__, importlib.metadata.version('apex'))\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_CUSTOMIZED = 'site-ran'\n")
    script = tmp_path / "spawner.py"
    script.write_text(CHILDREN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APEXLITE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    result = subprocess.run([sys.executable, "-m", "apexlite", "run", str(script)], capture_output=True,
                            text=True, timeout=TIMEOUT_S, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "parent apexlite.compat.apex",
        "spawn apexlite.compat.apex",
        "script apexlite.compat.apex 0.1+apexlite",
        "dash-c 0.1+apexlite False False site-ran apexlite.compat.apex",
    ], result.stderr
    outside = subprocess.run([sys.executable, str(tmp_path / "child.py")], capture_output=True, text=True,
                             timeout=TIMEOUT_S, cwd=tmp_path, env=env)
    assert outside.returncode != 0 and "PackageNotFoundError" in outside.stderr  # plain python: the local folder
