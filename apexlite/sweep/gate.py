"""The child's side of a sweep's rounds: pause between optimizer steps until the sweep says how many to run.

A sweep starts every combination at once and lets one run at a time: each child pauses after its warm-up
steps, then runs the number of timed steps the sweep asks for (a slice), reports their times and pauses
again, so the slices of one round run back to back and see the same machine. Paused, a child costs no
CPU. The protocol is one line each way over two pipes the sweep passes down:

  child -> sweep   {"wall": [s, ...], "waited": [s, ...]}  per step of the slice ([] when just warmed up):
                                                           its time, and how long its threads waited for
                                                           a CPU (None where Linux's schedstat is missing)
  sweep -> child   N                                     run one untimed step (it wakes threads and caches
                                                           after the pause), then N timed steps, and report
                   0                                     run on without pausing (the rounds are over)

Before it pauses, a run waits for the GPU work it queued, so slices never share the GPU. A step that
waited for a CPU was measured on a machine busy with other work; the sweep leaves such steps out
(apexlite.sweep.rounds). Only the process the sweep started takes part: the variable names the sweep's
pid, and a process whose parent is another one (a DataLoader worker, a script's own subprocess) ignores
it.
"""
from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

GATE_ENV = "APEXLITE_SWEEP_GATE"  # "<sweep pid>:<fd to read commands>:<fd to write reports>"


def _finish_device_work() -> None:
    """Wait for the CUDA work this process queued, when it uses CUDA (torch is not imported for this)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class RunQueueWait:
    """Seconds this process's threads have spent runnable but not running (Linux /proc schedstat)."""

    def __init__(self) -> None:
        self._files: List[int] = []
        self.available = os.path.exists("/proc/thread-self/schedstat")

    def refresh(self) -> None:
        """Open every current thread's schedstat (threads come and go between slices, rarely within one)."""
        self.close()
        if not self.available:
            return
        folder = "/proc/self/task"
        for thread in os.listdir(folder):
            try:
                self._files.append(os.open(os.path.join(folder, thread, "schedstat"), os.O_RDONLY))
            except OSError:
                pass

    def total(self) -> Optional[float]:
        if not self._files:
            return None
        waited = 0
        for descriptor in self._files:
            try:
                waited += int(os.pread(descriptor, 128, 0).split()[1])
            except (OSError, IndexError, ValueError):  # the thread ended
                pass
        return waited / 1e9

    def close(self) -> None:
        for descriptor in self._files:
            os.close(descriptor)
        self._files = []


class RoundGate:
    """Pauses the run between steps as the sweep asks, and reports each timed step's time and CPU wait."""

    process_gate: Optional["RoundGate"]  # set by the first from_environment() call in a process
    owner_pid: int

    def __init__(self, commands: int, reports: int) -> None:
        self._commands = os.fdopen(commands, "r", buffering=1)
        self._reports = os.fdopen(reports, "w", buffering=1)
        self._open = True
        self._waiting_for_warmup = True
        self._left = 0
        self._rewarm = False
        self._wall: List[float] = []
        self._waited: List[Optional[float]] = []
        self._run_queue = RunQueueWait()
        self._wait_mark: Optional[float] = None

    @classmethod
    def from_environment(cls) -> Optional["RoundGate"]:
        """The gate of a run a sweep started, else None (no sweep, or not the process it started). One per
        process: a script that starts amp over (deinitialize, initialize) keeps pacing through the same one."""
        if cls.__dict__.get("owner_pid") == os.getpid():
            return cls.process_gate
        gate = None
        try:
            sweep_pid, commands, reports = (int(part) for part in os.environ.get(GATE_ENV, "").split(":"))
            if os.getppid() == sweep_pid:
                gate = cls(commands, reports)
        except (ValueError, OSError):
            gate = None
        cls.process_gate, cls.owner_pid = gate, os.getpid()  # a forked child asks again, and gets None
        return gate

    def after_step(self, wall_s: float, timed: bool, warmed_up: bool) -> None:
        """Called at the end of every optimizer step, outside the step's own timing; may pause."""
        if not self._open:
            return
        waited = self._run_queue.total()
        if self._waiting_for_warmup:
            if warmed_up:
                self._waiting_for_warmup = False
                self._report_and_wait()
        elif timed and self._rewarm:
            self._rewarm = False  # the first step after a pause woke threads and caches: not timed
        elif timed:
            self._wall.append(wall_s)
            self._waited.append(None if waited is None or self._wait_mark is None
                                else max(0.0, waited - self._wait_mark))  # a thread that ended takes its count
            self._left -= 1
            if self._left <= 0:
                self._report_and_wait()
        self._wait_mark = self._run_queue.total()

    def _report_and_wait(self) -> None:
        _finish_device_work()  # the next run's slice must not share the GPU with this one's queued kernels
        try:
            self._reports.write(json.dumps({"wall": self._wall, "waited": self._waited}) + "\n")
            command = self._commands.readline()
        except (OSError, ValueError):  # the sweep went away: run on as if it had said 0
            command = ""
        self._wall, self._waited = [], []
        try:
            self._left = int(command)
        except ValueError:
            self._left = 0
        if self._left <= 0:
            self.close()
        else:
            self._rewarm = True
            self._run_queue.refresh()

    def close(self) -> None:
        """Stop pausing for good and let go of the pipes."""
        if self._open:
            self._open = False
            self._run_queue.close()
            for handle in (self._commands, self._reports):
                try:
                    handle.close()
                except OSError:
                    pass
