"""Run apex's own L0 amp, optimizer, fp16util and fused-layer-norm tests against apexlite, and judge the outcome.

    python scripts/run_apex_l0.py APEX [--commit REV] [--device cpu|cuda] [--suite NAME ...] [--python PY]
                                  [--keep DIR] [--log-dir DIR] [--timeout S] [--test-timeout S]
                                  [--autocast-dtype float16|bfloat16] [--collect-only]

APEX is an apex checkout or export (a folder holding tests/L0), or, with ``--commit``, an apex git
repository (bare or not) from which tests/L0 at REV is exported with ``git archive``. The tests are
copied into a scratch folder (nothing of apex's is written into this repository) and each suite is run in
its own process as ``python -m apexlite run -m pytest`` from the suite's folder (apex's tests import
their helpers, e.g. ``from utils import ...``, from there).

``--device cpu`` (the default) ports the tests to CPU by the mechanical rewrites in ``PORT_RULES`` and
nothing else. ``--device cuda`` runs them as apex wrote them, unchanged, on the GPU (it refuses to start
where torch sees none, unless ``--collect-only`` only collects them).

Each test's outcome is compared with ``scripts/apex_l0_expected.tsv`` (per device: the known failures, each
of which fails against apex's kernels too; data-dependent tests; deselected ones). Exit status: 0 when
every test not listed there passed or was skipped by apex itself, 1 on any unexpected failure or error (or
a suite that ran no test or ran out of time), 2 on bad arguments. Listed failures that now pass are
reported as stale. A suite that runs past ``--timeout`` is stopped and reported, and the others still run;
``--test-timeout`` makes pytest print every thread's stack when one test runs longer (a stall's where).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
EXPECTATIONS = HERE / "apex_l0_expected.tsv"
SUITES = ("run_amp", "run_optimizers", "run_fp16util", "run_fused_layer_norm")
DEFAULT_SUITES = {"cpu": ("run_amp", "run_optimizers", "run_fp16util"), "cuda": SUITES}
EXPECTATION_KINDS = ("fails", "flaky", "deselect")
EXPECTATION_DEVICES = ("any", "cpu", "cuda")

# The CPU port: (pattern, replacement) applied to every .py file of the exported suites, in order.
# AUTOCAST_DTYPE is filled in from --autocast-dtype.
PORT_RULES: Tuple[Tuple[str, str], ...] = (
    (r"\.cuda\(\)", ".cpu()"),                                                   # module/tensor .cuda()
    (r"\btorch\.cuda\.(Half|Float|Double|BFloat16|Int|Long|Byte|Bool)Tensor\b", r"torch.\1Tensor"),  # also names
    (r"\btorch\.cuda\.manual_seed\(", "torch.manual_seed("),
    (r"\btorch\.cuda\.synchronize\(", "torch.cpu.synchronize("),
    (r"device=(['\"])cuda\1", "device='cpu'"),
    (r"\.to\((['\"])cuda\1\)", ".to('cpu')"),
    (r"autocast\((['\"])cuda\1(?=[^)]*\bdtype=)", "autocast('cpu'"),                 # a call that names its dtype
    (r"autocast\((['\"])cuda\1", "autocast('cpu', dtype=torch.AUTOCAST_DTYPE"),
    (r"GradScaler\((['\"])cuda\1", "GradScaler('cpu'"),
    (r"only_for=\((['\"])cuda\1,?\)", "only_for=('cpu',)"),                          # device-type test classes
)


@dataclass(frozen=True)
class Expectation:
    kind: str
    reason: str


def read_expectations(path: Path = EXPECTATIONS, device: str = "cpu") -> Dict[str, Expectation]:
    """node id -> expectation on `device`, from the tab-separated table (lines starting with # are comments)."""
    table: Dict[str, Expectation] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 4 or fields[1] not in EXPECTATION_DEVICES or fields[2] not in EXPECTATION_KINDS:
            raise SystemExit(f"{path}:{number}: expected 'node id<TAB>{'|'.join(EXPECTATION_DEVICES)}<TAB>"
                             f"{'|'.join(EXPECTATION_KINDS)}<TAB>reason'")
        if fields[1] in ("any", device):
            table[fields[0]] = Expectation(fields[2], fields[3])
    return table


def export_tests(apex: Path, commit: Optional[str], into: Path) -> Path:
    """Copies apex's tests/L0 into ``into`` (from a checkout, or from git at ``commit``); returns its path."""
    if commit:
        archive = subprocess.run(["git", "-C", str(apex), "archive", commit, "tests/L0"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    else:
        source = apex / "tests" / "L0"
        if not source.is_dir():
            raise SystemExit(f"{apex} holds no tests/L0: pass an apex checkout, or a git repository with --commit")
        shutil.copytree(source, into / "tests" / "L0", dirs_exist_ok=True)
    return into / "tests" / "L0"


def port_file(path: Path, autocast_dtype: str) -> int:
    """Applies PORT_RULES to one file in place; returns the number of rewrites."""
    text = path.read_text()
    total = 0
    for pattern, replacement in PORT_RULES:
        text, count = re.subn(pattern, replacement.replace("AUTOCAST_DTYPE", autocast_dtype), text)
        total += count
    path.write_text(text)
    return total


def node_id(case: ElementTree.Element, suite: str) -> str:
    """``suite/file.py::Class::test`` from a junit (xunit1) testcase."""
    file = case.get("file", "")
    parts = case.get("classname", "").split(".")
    module = Path(file).with_suffix("").parts
    classes = parts[len(module):] if tuple(parts[:len(module)]) == module else parts[-1:]
    return "::".join(part for part in [f"{suite}/{file}", *classes, case.get("name", "")] if part)


def outcome_of(case: ElementTree.Element) -> str:
    for tag, outcome in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        if case.find(tag) is not None:
            return outcome
    return "passed"


def check_interpreter(python: str, suites: Tuple[str, ...], device: str, collect_only: bool) -> None:
    """Stops with a clear message when ``python`` lacks what the chosen suites import besides apex itself,
    or, to run on CUDA, a GPU."""
    probe = "import apexlite, pytest"
    if "run_optimizers" in suites or "run_fused_layer_norm" in suites:
        probe += ", expecttest, numpy, torch.testing._internal.common_device_type"
    if device == "cuda" and not collect_only:
        probe += "; import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'torch sees no CUDA device')"
    completed = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if completed.returncode != 0:
        reason = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"{python} cannot run apex's tests on {device}: {reason}. apex's optimizer and norm "
                         "tests import torch.testing._internal, which needs expecttest and numpy "
                         f"({python} -m pip install expecttest numpy); --device cuda needs a GPU.")


VERBOSE_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
VERBOSE_OUTCOMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
                    "XFAIL": "skipped", "XPASS": "passed"}


def outcomes_from_output(output: str, suite: str) -> Dict[str, str]:
    """node id -> outcome from pytest's -v lines (what a suite stopped by its timeout had finished)."""
    outcomes = {}
    for line in output.splitlines():
        match = VERBOSE_LINE.match(line)
        if match:
            outcomes[f"{suite}/{match.group(1)}"] = VERBOSE_OUTCOMES[match.group(2)]
    return outcomes


@dataclass
class SuiteRun:
    outcomes: Dict[str, str]
    timed_out: bool
    collected: int = 0


def run_suite(python: str, suite_dir: Path, deselected: List[str], report: Path, timeout: int,
              test_timeout: int, log: Path, collect_only: bool = False) -> SuiteRun:
    """Runs one suite under ``python -m apexlite run -m pytest`` (its output in ``log``)."""
    suite = suite_dir.name
    command = [python, "-m", "apexlite", "run", "-m", "pytest", "-v", "-p", "no:cacheprovider", "--durations=15",
               "-o", "junit_family=xunit1", f"--junitxml={report}", "--rootdir", str(suite_dir)]
    if test_timeout:
        command += ["-o", f"faulthandler_timeout={test_timeout}"]
    if collect_only:
        command.append("--collect-only")
    for nodeid in deselected:
        command += ["--deselect", nodeid.split("/", 1)[1]]
    command.append(".")
    environment = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    print(f"== {suite}: {' '.join(command[1:])}", flush=True)
    with open(log, "w") as output:
        process = subprocess.Popen(command, cwd=suite_dir, env=environment, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            timed_out = True
    text = log.read_text(errors="replace")
    tail = text.strip().splitlines()[-1:] or ["(no output)"]
    print(f"   pytest {'stopped after ' + str(timeout) + ' s' if timed_out else 'exit ' + str(process.returncode)}: "
          f"{tail[0]}", flush=True)
    if collect_only:
        return SuiteRun({}, timed_out, sum(1 for line in text.splitlines() if "<Function" in line
                                           or "<TestCaseFunction" in line))
    if timed_out or not report.exists():
        return SuiteRun(outcomes_from_output(text, suite), timed_out)
    cases = ElementTree.parse(report).getroot().iter("testcase")
    return SuiteRun({node_id(case, suite): outcome_of(case) for case in cases}, False)


def judge(outcomes: Dict[str, str], expected: Dict[str, Expectation]) -> Tuple[List[str], List[str]]:
    """(unexpected failures, stale expectations) for the outcomes of the suites that ran."""
    unexpected, stale = [], []
    for nodeid, outcome in sorted(outcomes.items()):
        kind = expected.get(nodeid, Expectation("passes", "")).kind
        if outcome in ("failed", "error") and kind not in ("fails", "flaky"):
            unexpected.append(f"{nodeid} ({outcome})")
        elif outcome == "passed" and kind == "fails":
            stale.append(nodeid)
    return unexpected, stale


def summarise(suite: str, outcomes: Dict[str, str]) -> str:
    counts: Dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return f"{suite}: " + ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped") if k in counts)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("apex", type=Path, help="apex checkout/export, or git repository with --commit")
    parser.add_argument("--commit", help="export tests/L0 from the git repository APEX at this revision")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: the mechanical CPU port; cuda: apex's tests unchanged, on the GPU")
    parser.add_argument("--suite", action="append", choices=SUITES,
                        help="suites to run (default: run_amp, run_optimizers and run_fp16util on cpu; all four on cuda)")
    parser.add_argument("--python", default=sys.executable, help="interpreter with apexlite installed")
    parser.add_argument("--keep", type=Path, help="export (and port) into this folder and keep it (default: a temporary one)")
    parser.add_argument("--log-dir", type=Path, help="keep each suite's pytest output here as SUITE.log")
    parser.add_argument("--autocast-dtype", choices=("float16", "bfloat16"), default="float16",
                        help="dtype of the ported autocast('cuda') regions (apex's tests use fp16 on CUDA; bfloat16, "
                             "autocast's CPU default, keeps a conv weight's grad in channels_last strides as apex's "
                             "CUDA runs do, where the fp16 cast on CPU returns it contiguous)")
    parser.add_argument("--expected", type=Path, default=EXPECTATIONS, help="the expected-outcomes table")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per suite (then it is stopped)")
    parser.add_argument("--test-timeout", type=int, default=0,
                        help="print every thread's stack when one test runs longer than this (0: never)")
    parser.add_argument("--collect-only", action="store_true", help="collect the tests, run none, judge nothing")
    args = parser.parse_args(argv)
    expected = read_expectations(args.expected, args.device)
    suites = tuple(args.suite or DEFAULT_SUITES[args.device])
    check_interpreter(args.python, suites, args.device, args.collect_only)
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="apex-l0-"))
    scratch.mkdir(parents=True, exist_ok=True)
    logs = args.log_dir or scratch
    logs.mkdir(parents=True, exist_ok=True)
    try:
        root = export_tests(args.apex.resolve(), args.commit, scratch)
        all_outcomes: Dict[str, str] = {}
        failed_to_run, timed_out = [], []
        for suite in suites:
            rewrites = 0
            if args.device == "cpu":
                rewrites = sum(port_file(path, args.autocast_dtype) for path in sorted((root / suite).rglob("*.py")))
            deselected = [n for n, e in expected.items() if e.kind == "deselect" and n.startswith(suite + "/")]
            started = time.monotonic()
            run = run_suite(args.python, root / suite, deselected, scratch / f"{suite}.xml", args.timeout,
                            args.test_timeout, logs / f"{suite}.log", args.collect_only)
            how = f"{rewrites} port rewrites" if args.device == "cpu" else "unported"
            if args.collect_only:
                print(f"   {suite}: {run.collected} collected ({how})")
                continue
            print(f"   {summarise(suite, run.outcomes)} ({how}, {time.monotonic() - started:.0f} s)")
            if run.timed_out:
                timed_out.append(suite)
            elif not run.outcomes:
                failed_to_run.append(suite)
            all_outcomes.update(run.outcomes)
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.collect_only:
        return 0
    return report(all_outcomes, expected, args.expected.name, failed_to_run, timed_out)


def report(outcomes: Dict[str, str], expected: Dict[str, Expectation], table: str, failed_to_run: List[str],
           timed_out: List[str]) -> int:
    """Prints the failures, stale entries and the verdict; returns the exit status."""
    unexpected, stale = judge(outcomes, expected)
    for nodeid, outcome in sorted(outcomes.items()):
        if outcome in ("failed", "error"):
            entry = expected.get(nodeid)
            print(f"{outcome.upper():7} {nodeid}" + (f"  [expected {entry.kind}: {entry.reason}]" if entry else ""))
    for nodeid in stale:
        print(f"STALE   {nodeid}: listed as failing in {table}, passed this time")
    if failed_to_run:
        print(f"suites that ran no test: {', '.join(failed_to_run)}")
    if timed_out:
        print(f"suites stopped at their timeout (their finished tests are judged above): {', '.join(timed_out)}")
    if unexpected or failed_to_run or timed_out:
        print(f"{len(unexpected)} unexpected failure(s)")
        return 1
    print("no unexpected failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
