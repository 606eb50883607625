"""The CPU share a build gets (apexlite/_native/cpu_share.py): fair sharing between scheduling groups, then
between a group's tasks, against hand-computed cases; and reading the runnable tasks from a faked /proc."""
from __future__ import annotations

import os

import pytest

from apexlite._native import cpu_share
from apexlite._native.cpu_share import Machine

# (capacity, demands) -> each group's cores
FAIR = [
    (2, [2], [2]),
    (2, [4, 3], [1, 1]),
    (2, [0.5, 4], [0.5, 1.5]),          # a group wanting less than half leaves the rest to the other
    (8, [1, 1, 10], [1, 1, 6]),
    (2, [], []),
]


@pytest.mark.parametrize("capacity, demands, shares", FAIR)
def test_fair_shares(capacity, demands, shares):
    assert cpu_share.fair_shares(capacity, demands) == pytest.approx(shares)


# Machine -> cores' worth of CPU the build's jobs get
SHARES = [
    (Machine(2, 2), 2.0),                                   # idle: a core per job
    (Machine(2, 2, beside=1.0), 4 / 3),                     # one other task in its session: 2 cores among 3
    (Machine(2, 2, beside=2.0), 1.0),                       # two hogs of its own shell: half the machine
    (Machine(2, 2, groups=(2.0,)), 1.0),                    # two hogs of another session: half too
    (Machine(2, 2, beside=2.0, groups=(1.0, 1.0, 2.0)), 0.25),  # 4 busy sessions: half a core for its 4 tasks
    (Machine(64, 1), 1.0),                                  # one job never gets more than a core
    (Machine(2, 2, groups=(0.2,)), 1.8),                    # a session that wants little takes little
]


@pytest.mark.parametrize("machine, share", SHARES, ids=[str(m) for m, _ in SHARES])
def test_share_of_the_cores(machine, share):
    assert machine.share == pytest.approx(share)


def test_description():
    assert str(Machine(2, 2, beside=1.94)) == "2 cores, 2 jobs, load 1.9"
    assert str(Machine(2, 2, 1.0, (2.0, 1.0))) == \
        "2 cores, 2 jobs, load 4.0 (1.0 in this session, 3.0 in 2 other sessions)"
    assert str(Machine(2, 2, 0.0, (1.2,))) == "2 cores, 2 jobs, load 1.2 (0.0 in this session, 1.2 in 1 other session)"


def _fake_proc(root, processes):
    """processes: {pid: (autogroup, [task states])}."""
    (root / "sys" / "kernel").mkdir(parents=True)
    (root / "sys" / "kernel" / "sched_autogroup_enabled").write_text("1\n")
    (root / "self").mkdir()
    (root / "self" / "autogroup").write_text("/autogroup-3 nice 0\n")
    for pid, (group, states) in processes.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "autogroup").write_text(f"{group} nice 0\n")
        for tid, state in enumerate(states):
            (root / str(pid) / "task" / str(tid)).mkdir(parents=True)
            (root / str(pid) / "task" / str(tid) / "stat").write_text(f"{pid} (python (x) y) {state} 1 2 3\n")


def test_running_tasks_by_group_from_proc(tmp_path, monkeypatch):
    _fake_proc(tmp_path, {
        10: ("/autogroup-3", ["R"]),            # a hog of this session
        11: ("/autogroup-3", ["S", "S"]),       # sleeping
        20: ("/autogroup-5", ["R", "R", "S"]),  # another session's two busy threads
        21: ("/autogroup-5", ["R"]),
        30: ("/autogroup-7", ["D"]),            # waiting for the disk, not for a core
        os.getpid(): ("/autogroup-3", ["R"]),   # the process asking
    })
    monkeypatch.setattr(cpu_share, "PROC", str(tmp_path))
    monkeypatch.setattr(cpu_share, "AUTOGROUP_SWITCH", str(tmp_path / "sys" / "kernel" / "sched_autogroup_enabled"))
    assert cpu_share.running_now(samples=2, interval=0.0) == (1.0, (3.0,))
    (tmp_path / "sys" / "kernel" / "sched_autogroup_enabled").write_text("0\n")  # one group for all
    assert cpu_share.running_now(samples=1) == (4.0, ())
    monkeypatch.setattr(cpu_share, "PROC", str(tmp_path / "missing"))
    assert cpu_share.running_now(samples=1) is None


def test_an_empty_autogroup_file_counts_every_task_in_one_group(tmp_path, monkeypatch):
    """Some containers have autogroup on but give empty /proc/<pid>/autogroup files (CI's did)."""
    _fake_proc(tmp_path, {10: ("", ["R"]), 20: ("", ["R", "R"]), os.getpid(): ("", ["R"])})
    (tmp_path / "self" / "autogroup").write_text("")
    for pid in (10, 20, os.getpid()):
        (tmp_path / str(pid) / "autogroup").write_text("")
    monkeypatch.setattr(cpu_share, "PROC", str(tmp_path))
    monkeypatch.setattr(cpu_share, "AUTOGROUP_SWITCH", str(tmp_path / "sys" / "kernel" / "sched_autogroup_enabled"))
    assert cpu_share.running_now(samples=1) == (3.0, ())
    (tmp_path / "self" / "autogroup").write_text("/autogroup-3 nice 0\n")  # only the others' are empty
    assert cpu_share.running_now(samples=1) == (0.0, (3.0,))


def test_without_proc_the_load_average_stands_in(monkeypatch):
    monkeypatch.setattr(cpu_share, "running_now", lambda: None)
    monkeypatch.setattr(cpu_share.os, "getloadavg", lambda: (3.0, 0.0, 0.0))
    assert cpu_share.this_machine(2) == Machine(cpu_share.usable_cores(), 2, 3.0)
