"""apexlite.child_process: the one place sweep and migrate --verify run child processes (time limit, the
whole process tree ended, the failing exception's line)."""
import sys
import textwrap
import time

import pytest

from apexlite import child_process
from apexlite.child_process import FAILED, OK, TIMEOUT, run_child
from tests._helpers.child_process import process_alive

EXCEPTION_LINES = [
    ("numpy noise first",
     "/x/torch/functional_tensor.py:368: UserWarning: Failed to initialize NumPy\n  cpu = f()\n"
     "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n    f()\n"
     "ValueError: bad shape (8, 3)\n", "ValueError: bad shape (8, 3)"),
    ("chained: the last exception",
     "Traceback (most recent call last):\n  File \"a\", line 1\nKeyError: 'x'\n\nDuring handling of the above "
     "exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"b\", line 2\n"
     "RuntimeError: while handling\n", "RuntimeError: while handling"),
    ("noise after the traceback",
     "Traceback (most recent call last):\n  File \"a\", line 1\nOSError: disk full\nprofiler_stop\n",
     "OSError: disk full"),
    ("no traceback: sys.exit(message)", "step 1\nstopping: no data left\n", "stopping: no data left"),
    ("nothing at all", "", "no error output"),
]


@pytest.mark.parametrize("name,stderr,expected", EXCEPTION_LINES, ids=[case[0] for case in EXCEPTION_LINES])
def test_exception_line_is_the_final_exception(name, stderr, expected):
    assert child_process.exception_line(stderr) == expected


def test_run_child_ok_and_failed():
    assert run_child([sys.executable, "-c", "print('fine')"], timeout=60).status == OK
    failed = run_child([sys.executable, "-c", "import sys; sys.stderr.write('warning\\n'); raise KeyError('x')"],
                       timeout=60)
    assert (failed.status, failed.exit_code, failed.error) == (FAILED, 1, "exit code 1: KeyError: 'x'")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_run_child_timeout_ends_the_whole_tree(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(300)
    """)
    outcome = run_child([sys.executable, "-c", script], timeout=8)
    assert outcome.status == TIMEOUT and outcome.exit_code is None
    assert outcome.error == "did not finish within 8s; killed with its child processes"
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10  # SIGKILL is sent before run_child returns; the kernel ends it moments later
    while process_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(grandchild)
