"""Progress lines while a build runs (apexlite/_native/build_progress.py): steps counted from the object files
a build writes, a line per step at most every `quiet` seconds, a heartbeat without one, stale objects not
counted; and the background thread saying them while a (simulated) build runs."""
from __future__ import annotations

import os
import threading
import time

from apexlite._native import build_progress
from apexlite._native.build_progress import BuildProgress


def _progress(folder, said, sources=3):
    return BuildProgress(folder, sources, "compiling x", "about 1.5 min", said.append, quiet=10.0, heartbeat=30.0)


def test_steps_come_from_the_object_files_written_since_the_start(tmp_path):
    stale = tmp_path / "old.o"
    stale.write_bytes(b"")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    progress = _progress(tmp_path, [])
    (tmp_path / "a.o.d").write_text("dependencies, written before the object")
    assert progress.steps_done() == 0 and not progress.complete()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.o").write_bytes(b"")  # setuptools' objects mirror the source folders
    (tmp_path / "b.cuda.o").write_bytes(b"")
    assert progress.steps_done() == 2 and not progress.complete()
    (tmp_path / "c.o").write_bytes(b"")
    assert progress.steps_done() == 3 and progress.complete()


def test_a_missing_folder_is_no_steps(tmp_path):
    assert _progress(tmp_path / "not-yet", []).steps_done() == 0


# (seconds since the start, objects written by then) -> the line said at that look, or None
LOOKS = [
    (5, 1, None),                       # a step, but under `quiet` seconds since the start
    (11, 1, "compiling x: 1 of 4 steps done after 11 s (estimated: about 1.5 min)"),
    (15, 2, None),                      # quiet again
    (21, 2, "compiling x: 2 of 4 steps done after 21 s (estimated: about 1.5 min)"),
    (45, 2, None),                      # no step, heartbeat not due
    (51, 2, "compiling x: 2 of 4 steps done after 51 s (estimated: about 1.5 min)"),  # heartbeat
    (62, 3, "compiling x: 3 of 4 steps done after 62 s (estimated: about 1.5 min)"),
]


def test_lines_per_step_and_a_heartbeat(tmp_path):
    progress = _progress(tmp_path, [])
    start = progress._started_monotonic
    for seconds, objects, expected in LOOKS:
        for index in range(objects):
            (tmp_path / f"s{index}.o").touch(exist_ok=True)
        assert progress.check(start + seconds) == expected, seconds


def test_the_thread_says_the_lines_while_the_build_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(build_progress, "POLL_SECONDS", 0.02)
    said = []
    seen = threading.Event()
    progress = BuildProgress(tmp_path, 2, "compiling x", "about 5 s", lambda line: (said.append(line), seen.set()),
                             quiet=0.0, heartbeat=60.0)
    with progress:
        (tmp_path / "a.o").write_bytes(b"")
        assert seen.wait(5.0)
    assert said[0].startswith("compiling x: 1 of 3 steps done after ")
    assert not any(thread.name == "apexlite-build-progress" for thread in threading.enumerate())
