"""`apexlite run` destroys a gloo group the script left alive, from an exit handler, so gloo's worker threads
finish while the interpreter can still give them the GIL (apexlite.gloo_exit): after the script's own exit
handlers, only when the script ended normally. Observed from an exit handler that runs after the runner's:
is the group still initialised, and are the threads the group started still alive."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# threads of this process, from the kernel's list (torch names gloo's only from some version on)
THREADS = textwrap.dedent("""
    import os

    def threads():
        return len(os.listdir("/proc/self/task"))
""")

# its handler is registered before the run, so it runs after the runner's (exit handlers run last-in first-out)
OBSERVER = textwrap.dedent("""
    import atexit, sys
    from threads import threads

    def observe():
        import torch.distributed as dist
        print(f"at exit: initialised {dist.is_initialized()} threads {threads()}", flush=True)

    atexit.register(observe)
    from apexlite.runner import main
    sys.exit(main(sys.argv[1:]))
""")

SCRIPT_HEAD = textwrap.dedent("""
    import atexit, sys
    import torch
    import torch.distributed as dist
    from threads import threads

    before = threads()
    dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
    gathered = [torch.empty(3)]
    dist.all_gather(gathered, torch.ones(3))
    print(f"threads: before the group {before} with it {threads()}", flush=True)
""")

# (case, '-m: ' when run as a module; the script's last lines; exit status; group initialised at exit;
#  the group's threads joined at exit)
CASES = [
    ("ends", "", 0, False, True),
    ("sys.exit()", "sys.exit()", 0, False, True),
    ("sys.exit(0)", "sys.exit(0)", 0, False, True),
    ("destroys the group itself", "dist.destroy_process_group()", 0, False, True),
    ("its own exit handler uses the group",
     "def last_reduce():\n    total = torch.ones(2)\n    dist.all_reduce(total)\n    print('handler reduced', total.tolist())\n"
     "atexit.register(last_reduce)", 0, False, True),
    ("sys.exit(3)", "sys.exit(3)", 3, True, False),
    ("raises", "raise RuntimeError('the script failed')", 1, True, False),
    ("-m: ends", "", 0, False, True),
    ("-m: raises", "raise RuntimeError('the module failed')", 1, True, False),
]


def _run(tmp_path: Path, tail: str, as_module: bool) -> subprocess.CompletedProcess:
    (tmp_path / "threads.py").write_text(THREADS)
    (tmp_path / "observer.py").write_text(OBSERVER)
    (tmp_path / "script.py").write_text(SCRIPT_HEAD + tail + "\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    target = ["-m", "script"] if as_module else [str(tmp_path / "script.py")]
    return subprocess.run([sys.executable, str(tmp_path / "observer.py"), *target, str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)


@pytest.mark.parametrize("case,tail,status,initialised,joined", CASES, ids=[case[0] for case in CASES])
def test_a_run_releases_the_gloo_group_only_after_a_normal_end(tmp_path, case, tail, status, initialised, joined):
    result = _run(tmp_path, tail, as_module=case.startswith("-m: "))
    assert result.returncode == status, result.stdout + result.stderr
    counts = re.search(r"threads: before the group (\d+) with it (\d+)", result.stdout)
    at_exit = re.findall(r"at exit: initialised (True|False) threads (\d+)", result.stdout)
    assert counts and len(at_exit) == 1, result.stdout + result.stderr
    before, with_group = map(int, counts.groups())
    assert with_group > before, "the gloo group started no threads to watch"
    assert at_exit[0][0] == str(initialised)
    threads_at_exit = int(at_exit[0][1])
    assert (threads_at_exit <= before) if joined else (threads_at_exit >= with_group), (before, with_group, at_exit)
    if "exit handler uses the group" in case:  # the script's handler ran first, with the group still there
        assert "handler reduced [1.0, 1.0]" in result.stdout, result.stdout + result.stderr
