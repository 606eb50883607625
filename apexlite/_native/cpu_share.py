"""The share of this machine's CPU a build's parallel jobs will get, from what runs on it now.

Standard library only (setup.py loads it through build_time). Linux's scheduler shares the cores
fairly between scheduling groups first, then between the tasks of a group. With autogroup on (most
desktop and many server kernels: /proc/sys/kernel/sched_autogroup_enabled), each session (a terminal,
a service, another user's job) is a group, so a build beside two CPU hogs of its own shell gets far
less than one beside the same hogs run from another session. The tasks that want a core now are read
from /proc (state R, averaged over half a second) with their group; where /proc cannot be read, the
1-minute load average stands for them, all in the build's own group.
"""
from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

PROC = "/proc"
AUTOGROUP_SWITCH = "/proc/sys/kernel/sched_autogroup_enabled"


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def fair_shares(capacity: float, demands: Sequence[float]) -> List[float]:
    """Cores each group gets when `capacity` cores are shared fairly among groups wanting `demands` cores
    (each task of a group wants one): a group wanting less than an equal part gets what it wants, the
    rest is shared by the others."""
    shares = [0.0] * len(demands)
    remaining = float(capacity)
    order = sorted(range(len(demands)), key=lambda index: demands[index])
    for done, index in enumerate(order):
        shares[index] = min(float(demands[index]), remaining / (len(order) - done))
        remaining -= shares[index]
    return shares


@dataclass(frozen=True)
class Machine:
    """What decides a build's speed here: usable cores, the build's parallel jobs, the other runnable
    tasks in the build's own scheduling group (`beside`) and in each other group (`groups`)."""

    cores: int
    jobs: int
    beside: float = 0.0
    groups: Tuple[float, ...] = ()

    @property
    def load(self) -> float:
        """Other tasks that want a core, whatever their group."""
        return self.beside + sum(self.groups)

    def __str__(self) -> str:
        """'2 cores, 2 jobs, load 3.1 (2.0 in this session, 1.1 in 2 other sessions)'."""
        said = f"{self.cores} cores, {self.jobs} jobs, load {self.load:.1f}"
        if not self.groups:
            return said
        others = f"{len(self.groups)} other session{'s' if len(self.groups) > 1 else ''}"
        return f"{said} ({self.beside:.1f} in this session, {sum(self.groups):.1f} in {others})"

    @property
    def share(self) -> float:
        """Cores' worth of CPU the build's jobs get together."""
        ours = self.jobs + self.beside
        return fair_shares(self.cores, (ours,) + tuple(self.groups))[0] * self.jobs / ours


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _group(pid: str, autogroups: bool) -> str:
    """The scheduling group of process `pid` ("/autogroup-7"), or one group for all where autogroup is
    off. Some containers give an empty autogroup file: that process's group is "unknown"."""
    if not autogroups:
        return "all"
    words = _read(f"{PROC}/{pid}/autogroup").split()
    return words[0] if words else "unknown"


def runnable_by_group(autogroups: bool, skip_pid: int) -> Dict[str, int]:
    """{group: tasks in state R now}, leaving out process `skip_pid` (the one asking, which waits for the build)."""
    counts: Dict[str, int] = collections.Counter()
    for pid in os.listdir(PROC):
        if not pid.isdigit() or int(pid) == skip_pid:
            continue
        try:
            running = 0
            for task in os.listdir(f"{PROC}/{pid}/task"):
                stat = _read(f"{PROC}/{pid}/task/{task}/stat")
                running += stat[stat.rindex(")") + 2] == "R"
            if running:
                counts[_group(pid, autogroups)] += running
        except (OSError, ValueError, IndexError):  # the process ended while being read
            continue
    return counts


def running_now(samples: int = 10, interval: float = 0.05) -> Optional[Tuple[float, Tuple[float, ...]]]:
    """(tasks running beside this process in its group, those of each other group), averaged over
    `samples` looks; None where /proc cannot be read."""
    try:
        autogroups = _read(AUTOGROUP_SWITCH).strip() == "1"
        own = _group("self", autogroups)
    except OSError:
        autogroups, own = False, "all"
    if own == "unknown":  # this process's group cannot be read: the groups cannot be told apart
        autogroups, own = False, "all"
    totals: Dict[str, float] = collections.Counter()
    try:
        for look in range(samples):
            for group, count in runnable_by_group(autogroups, os.getpid()).items():
                totals[group] += count / samples
            if look + 1 < samples:
                time.sleep(interval)
    except OSError:
        return None
    beside = totals.pop(own, 0.0)
    return beside, tuple(sorted(totals.values(), reverse=True))


def this_machine(jobs: int) -> Machine:
    """This machine now, for a build of `jobs` parallel jobs started by this process."""
    now = running_now()
    if now is None:
        try:
            average = os.getloadavg()[0]
        except (AttributeError, OSError):
            average = 0.0
        return Machine(usable_cores(), jobs, average)
    return Machine(usable_cores(), jobs, now[0], now[1])
