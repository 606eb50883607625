"""How long a kernel build will take on this machine, from its cores, its load and the builds it has done.

Standard library only: setup.py loads it (with build_plan) before torch is importable.

A build's work is its compilers' CPU seconds, nearly the same for one library, compiler and torch
whatever else runs. Its wall time is that work divided by the CPU its jobs get (cpu_share.py: a core
each while the machine has cores to spare, a fair share when other tasks want them too). The work
comes from the builds this machine has done (a history file beside the first-use cache), same
library, compiler and torch preferred; else from the reference machine's figures (BENCHMARKS.md,
"Building the kernels").
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from .cpu_share import Machine, this_machine  # relative: setup.py loads this package on its own

# Compiler CPU seconds of each library on the 2-vCPU reference machine (g++ 12; BENCHMARKS.md, "Building the
# kernels"): 85-105 s for the CPU library on a quiet machine, 126-156 s beside other builds and tests.
REFERENCE_CPU_SECONDS = {"cpu": 120.0, "cuda": 30.0}
HISTORY_FILE = "build_times.json"
HISTORY_KEPT = 40   # past builds remembered, newest last
RECENT = 3          # the work is the median of the newest this many matching builds


@dataclass(frozen=True)
class PastBuild:
    """One finished build on this machine, as the history file keeps it."""

    library: str        # "cpu", "cuda", or "cpu+cuda" for an install that compiled both at once
    cpu_seconds: float  # the compilers' user + sys time
    wall_seconds: float
    torch: Optional[str]
    compiler: Optional[str]
    cores: int
    load: float         # other tasks wanting a core when it started (cpu_share.Machine.load)
    jobs: int
    when: str = ""


@dataclass(frozen=True)
class Estimate:
    """How long a build should take here, and the facts that say so (for its announcement)."""

    seconds: float
    work: float   # CPU seconds assumed
    basis: str    # where `work` comes from
    machine: Machine

    @property
    def about(self) -> str:
        """'about 2 min'."""
        return f"about {format_duration(self.seconds)}"

    @property
    def why(self) -> str:
        """'2 cores, 2 jobs, load 1.9; 95 CPU s, the median of the last 3 builds here'."""
        return f"{self.machine}; {self.work:.0f} CPU s, {self.basis}"


def format_duration(seconds: float) -> str:
    """'45 s' under 100 s (to 5 s), else minutes to the half minute under 10 min, whole minutes above."""
    if seconds < 100:
        return f"{max(5, 5 * round(seconds / 5))} s"
    minutes = seconds / 60
    if minutes < 10:
        return f"{round(minutes * 2) / 2:g} min"
    return f"{round(minutes)} min"


def _matching(history: Sequence[PastBuild], library: str, torch: Optional[str],
              compiler: Optional[str]) -> Tuple[List[PastBuild], str]:
    """The past builds of `library` closest to this one: same compiler and torch, then same compiler, then any."""
    same = [b for b in history if b.library == library]
    for keep, why in ((lambda b: b.compiler == compiler and b.torch == torch, "this compiler and torch"),
                      (lambda b: b.compiler == compiler, "this compiler"), (lambda b: True, "")):
        found = [b for b in same if keep(b)]
        if found:
            return found[-RECENT:], why
    return [], ""


def work_seconds(library: str, history: Sequence[PastBuild], torch: Optional[str] = None,
                 compiler: Optional[str] = None) -> Tuple[float, str]:
    """(CPU seconds a build of `library` needs, where that figure comes from). `library` may be "cpu+cuda":
    a past build of both at once, else the sum of the parts."""
    found, why = _matching(history, library, torch, compiler)
    if found:
        builds = "the last build here" if len(found) == 1 else f"the median of the last {len(found)} builds here"
        return statistics.median(b.cpu_seconds for b in found), builds + (f" with {why}" if why else "")
    parts = library.split("+")
    if len(parts) > 1:
        figures = [work_seconds(part, history, torch, compiler) for part in parts]
        bases = sorted({basis for _, basis in figures})
        return sum(seconds for seconds, _ in figures), "; ".join(bases)
    return REFERENCE_CPU_SECONDS[library], "measured on the reference machine, none here yet"


def estimate(library: str, machine: Machine, history: Sequence[PastBuild], torch: Optional[str] = None,
             compiler: Optional[str] = None) -> Estimate:
    """The wall time a build of `library` should take on `machine`, given the builds it has done."""
    work, basis = work_seconds(library, history, torch, compiler)
    return Estimate(work / machine.share, work, basis, machine)


def estimate_here(library: str, jobs: int, torch: Optional[str] = None, compiler: Optional[str] = None) -> Estimate:
    """The estimate for a build of `library` with `jobs` parallel jobs on this machine, now."""
    return estimate(library, this_machine(jobs), read_history(history_file()), torch, compiler)


def history_file(environ: Mapping[str, str] = os.environ) -> Path:
    """$TORCH_EXTENSIONS_DIR/apexlite/build_times.json, else in torch's default extensions folder (on
    Linux $XDG_CACHE_HOME or ~/.cache, then torch_extensions), beside the first-use builds."""
    explicit = environ.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return Path(explicit) / "apexlite" / HISTORY_FILE
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torch_extensions" / "apexlite" / HISTORY_FILE


def read_history(path: Path) -> List[PastBuild]:
    """The past builds recorded in `path`, oldest first; [] when there is none or it cannot be read."""
    try:
        rows = json.loads(path.read_text())
        return [PastBuild(**row) for row in rows]
    except (OSError, ValueError, TypeError):
        return []


def remember(path: Path, build: PastBuild) -> None:
    """Adds `build` to the history in `path`; a history that cannot be written is only a worse estimate later."""
    stamped = PastBuild(**{**asdict(build), "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")})
    rows = [asdict(b) for b in read_history(path)[-(HISTORY_KEPT - 1):]] + [asdict(stamped)]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(rows, indent=1) + "\n")
        os.replace(temporary, path)
    except OSError:
        pass


class Stopwatch:
    """Wall and child-process CPU seconds of a build (the compilers are this process's children)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._cpu_before = self._children_cpu()

    @staticmethod
    def _children_cpu() -> float:
        used = os.times()  # children that were waited for, and theirs (the compilers under ninja)
        return used.children_user + used.children_system

    def wall(self) -> float:
        return time.monotonic() - self.started

    def cpu(self) -> float:
        return self._children_cpu() - self._cpu_before

    def finished(self, library: str, machine: Machine, torch: Optional[str], compiler: Optional[str]) -> PastBuild:
        """The build just finished, for the history (`machine`: as it was when the build started). Where
        children's CPU time is not counted (Windows), the wall time at the start's share stands in for it."""
        wall = self.wall()
        cpu = self.cpu() or wall * machine.share
        return PastBuild(library, round(cpu, 1), round(wall, 1), torch, compiler, machine.cores,
                         round(machine.load, 2), machine.jobs)
