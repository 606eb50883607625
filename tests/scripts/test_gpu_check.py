"""scripts/gpu_check.sh's plan, run with a stand-in interpreter that claims a GPU: the step order (benchmarks on
a quiet machine before the tests), the whole check's budget (no step outlives it; later steps are skipped, saying
so), and the arguments the tests and apex's suites get. The real steps need a GPU (see BENCHMARKS.md)."""
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

# Answers the script's `-c` probes as a CUDA machine would, logs every other call and sleeps as told per call
# kind (FAKE_SLEEP_<KIND>, KIND: pip, doctor, bench, pytest, apex), so steps take known times.
FAKE_PYTHON = r"""#!/usr/bin/env bash
if [ "$1" = "-c" ]; then
    case "$2" in
        *get_device_name*) echo "FakeGPU | torch 0.0 | CUDA 0.0" ;;
        *get_device_capability*) echo "9.0" ;;
        *"import xdist"*) exit "${FAKE_XDIST_STATUS:-0}" ;;
    esac
    exit 0
fi
echo "$*" >> "$FAKE_LOG"
case "$*" in
    *"-m pip"*) sleep "${FAKE_SLEEP_PIP:-0}" ;;
    *"-m apexlite doctor"*) sleep "${FAKE_SLEEP_DOCTOR:-0}" ;;
    *"-m bench."*) sleep "${FAKE_SLEEP_BENCH:-0}" ;;
    *"-m pytest"*) sleep "${FAKE_SLEEP_PYTEST:-0}" ;;
    *run_apex_l0.py*) sleep "${FAKE_SLEEP_APEX:-0}" ;;
esac
exit 0
"""

BENCH_STEPS = ["bench_adam_tensors", "bench_zero_grad", "bench_flat_scan", "bench_gpu", "bench_repeated_initialize"]


def run_check(tmp_path: Path, env: Dict[str, str]) -> Tuple[subprocess.CompletedProcess, float, List[str], Dict[str, str]]:
    """Runs the script with the stand-in; returns the process, its seconds, the logged calls and step -> status."""
    fake = tmp_path / "fakepython"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out, log = tmp_path / "out", tmp_path / "calls.log"
    full_env = {**os.environ, "PYTHON": str(fake), "FAKE_LOG": str(log), "APEXLITE_GPU_CHECK_OUT": str(out),
                "APEXLITE_GPU_CHECK_COMMIT": "test", **env}
    started = time.monotonic()
    process = subprocess.run(["bash", str(SCRIPT)], env=full_env, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - started
    calls = log.read_text().splitlines() if log.exists() else []
    statuses = {}
    for line in (out / "summary.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] not in ("step",):
            statuses[cells[0]] = cells[1]
    return process, seconds, calls, statuses


def test_the_benchmarks_run_before_the_tests_and_apex_suites(tmp_path):
    apex = tmp_path / "apex"
    (apex / "tests" / "L0").mkdir(parents=True)
    process, _, calls, statuses = run_check(tmp_path, {"APEXLITE_APEX_TESTS": str(apex)})
    assert process.returncode == 0, process.stdout + process.stderr
    kinds = ["pip" if "-m pip" in c else "doctor" if "apexlite doctor" in c else "bench" if "-m bench." in c
             else "pytest" if "-m pytest" in c else "apex" if "run_apex_l0.py" in c else c for c in calls]
    last_bench = max(i for i, kind in enumerate(kinds) if kind == "bench")
    first_test = min(i for i, kind in enumerate(kinds) if kind in ("pytest", "apex"))
    assert kinds[:2] == ["pip", "doctor"] and last_bench < first_test, kinds
    assert kinds.count("pytest") == 2 and kinds.count("apex") == 4
    assert all(statuses[name] == "passed" for name in BENCH_STEPS + ["build", "doctor", "tests_cuda"]), statuses


def test_a_step_is_cut_to_the_budget_and_later_steps_are_skipped(tmp_path):
    budget = 8
    process, seconds, calls, statuses = run_check(tmp_path, {
        "APEXLITE_GPU_CHECK_STEPS": "build doctor bench", "APEXLITE_GPU_CHECK_BUDGET_S": str(budget),
        "FAKE_SLEEP_PIP": "1", "FAKE_SLEEP_DOCTOR": "60"})
    assert process.returncode == 1
    assert statuses["build"] == "passed"
    assert statuses["doctor"] == "STOPPED at its limit"
    for name in BENCH_STEPS:
        assert statuses[name].startswith("SKIPPED: the check's budget of 8 s was spent"), statuses
    assert not any("-m bench." in call for call in calls)
    assert seconds < budget + 10, seconds  # doctor's 60 s were cut to the budget's rest
    assert f"of a {budget} s budget; 6 step(s) not passed" in process.stdout


@pytest.mark.parametrize("workers, xdist_status, expected", [
    ("4", "0", ["-n", "4", "--dist", "worksteal"]),
    ("0", "0", None),
    ("4", "1", None),  # pytest-xdist missing: one process
])
def test_the_cuda_tests_run_in_workers_when_xdist_is_there(tmp_path, workers, xdist_status, expected):
    _, _, calls, _ = run_check(tmp_path, {"APEXLITE_GPU_CHECK_STEPS": "tests",
                                          "APEXLITE_GPU_CHECK_TEST_WORKERS": workers,
                                          "FAKE_XDIST_STATUS": xdist_status})
    cuda_call = next(call for call in calls if "-m cuda" in call).split()
    if expected is None:
        assert "-n" not in cuda_call
    else:
        start = cuda_call.index("-n")
        assert cuda_call[start:start + 4] == expected


def test_apex_suites_stop_themselves_inside_the_step_limit(tmp_path):
    apex = tmp_path / "apex"
    (apex / "tests" / "L0").mkdir(parents=True)
    _, _, calls, statuses = run_check(tmp_path, {"APEXLITE_GPU_CHECK_STEPS": "apex", "APEXLITE_APEX_TESTS": str(apex),
                                                 "APEXLITE_GPU_CHECK_BUDGET_S": "100"})
    apex_calls = [call.split() for call in calls if "run_apex_l0.py" in call]
    assert sorted(call[call.index("--suite") + 1] for call in apex_calls) == [
        "run_amp", "run_fp16util", "run_fused_layer_norm", "run_optimizers"]
    for call in apex_calls:
        inner = int(call[call.index("--timeout") + 1])
        assert 80 <= inner <= 85, call  # the budget's rest (99-100 s) less 15 s
    assert all(statuses[f"apex_{suite}"] == "passed" for suite in ("run_amp", "run_fused_layer_norm"))


@pytest.mark.parametrize("probe_status,exit_status,said", [
    (1, 2, "cannot import torch"),  # the interpreter has no torch: an error, not "nothing to check"
    (0, 0, "torch sees no CUDA device"),
])
def test_without_torch_it_fails_and_without_a_gpu_it_says_so_writing_nothing(tmp_path, probe_status, exit_status, said):
    """An interpreter that cannot import torch stops the check with exit 2 (the README's setup puts torch in ./.venv,
    which the script then uses); torch without a GPU exits 0 saying there is nothing to check. Neither leaves a
    results folder."""
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\ncase "$2" in *cuda.is_available*) exit 1 ;; *"import torch"*) '
                    f'exit {probe_status} ;; *) echo "torch 0.0 CUDA None" ;; esac\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    process = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "PYTHON": str(fake),
                                                         "APEXLITE_GPU_CHECK_OUT": str(out)},
                             capture_output=True, text=True, timeout=60)
    assert process.returncode == exit_status, process.stdout + process.stderr
    assert said in process.stdout + process.stderr
    assert not out.exists()
