"""scripts/run_apex_l0.py: the CPU port of apex's L0 tests and the verdict against the expected outcomes.

apex itself is not needed: a small stand-in for apex's tests/L0 exercises the port rules, the run
through ``python -m apexlite run -m pytest``, and each kind of verdict.
"""
from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "run_apex_l0.py"


@functools.lru_cache(maxsize=None)
def _load_script():
    spec = importlib.util.spec_from_file_location("run_apex_l0", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def test_port_rules_rewrite_cuda_forms_only(tmp_path):
    source = tmp_path / "case.py"
    source.write_text(textwrap.dedent("""\
        model = Model().cuda()
        a = torch.cuda.FloatTensor(3).fill_(1); HALF = 'torch.cuda.HalfTensor'
        torch.cuda.manual_seed(1); torch.cuda.synchronize()
        x = torch.ones(2, device='cuda'); y = x.to("cuda")
        with torch.amp.autocast('cuda', enabled=True):
            with torch.amp.autocast("cuda", dtype=dtype):
                scaler = torch.amp.GradScaler('cuda', enabled=True)
        skip = torch.cuda.device_count() < 2
        instantiate_device_type_tests(TestNorm, globals(), only_for=("cuda",))
    """))
    assert _load_script().port_file(source, "bfloat16") == 11
    assert source.read_text() == textwrap.dedent("""\
        model = Model().cpu()
        a = torch.FloatTensor(3).fill_(1); HALF = 'torch.HalfTensor'
        torch.manual_seed(1); torch.cpu.synchronize()
        x = torch.ones(2, device='cpu'); y = x.to('cpu')
        with torch.amp.autocast('cpu', dtype=torch.bfloat16, enabled=True):
            with torch.amp.autocast('cpu', dtype=dtype):
                scaler = torch.amp.GradScaler('cpu', enabled=True)
        skip = torch.cuda.device_count() < 2
        instantiate_device_type_tests(TestNorm, globals(), only_for=('cpu',))
    """)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_shipped_expectations_parse(device):
    script = _load_script()
    table = script.read_expectations(device=device)
    assert {e.kind for e in table.values()} <= {"fails", "flaky", "deselect"}
    assert all(nodeid.split("/")[0] in script.SUITES for nodeid in table)


def test_expectations_apply_to_their_device_only(tmp_path):
    table = tmp_path / "expected.tsv"
    table.write_text("run_amp/a.py::A::t\tcpu\tfails\tCPU only\nrun_amp/b.py::B::t\tany\tflaky\tboth\n"
                     "run_amp/c.py::C::t\tcuda\tdeselect\tGPU only\n")
    read = _load_script().read_expectations
    assert sorted(read(table, "cpu")) == ["run_amp/a.py::A::t", "run_amp/b.py::B::t"]
    assert sorted(read(table, "cuda")) == ["run_amp/b.py::B::t", "run_amp/c.py::C::t"]
    table.write_text("run_amp/a.py::A::t\tfails\tthe old three-column form\n")
    with pytest.raises(SystemExit, match="expected 'node id<TAB>any"):
        read(table, "cpu")


def test_verdict_flags_unexpected_failures_and_stale_entries(tmp_path):
    suite = tmp_path / "apex" / "tests" / "L0" / "run_fp16util"
    suite.mkdir(parents=True)
    (suite / "helpers.py").write_text("DEVICE = 'cpu'\n")
    (suite / "test_stand_in.py").write_text(textwrap.dedent("""\
        import unittest
        import torch
        from apex import amp  # resolved by `python -m apexlite run`
        from helpers import DEVICE  # apex's tests import helpers from their own folder

        class TestStandIn(unittest.TestCase):
            def test_ported(self):
                self.assertEqual(torch.ones(1).cuda().device.type, DEVICE)
                self.assertTrue(hasattr(amp, "initialize"))
            def test_known_failure(self):
                self.fail("fails against apex too")
            def test_fixed_since(self):
                pass
            def test_new_failure(self):
                self.fail("a regression")
            def test_not_run(self):
                self.fail("deselected")
    """))
    expected = tmp_path / "expected.tsv"
    prefix = "run_fp16util/test_stand_in.py::TestStandIn::"
    expected.write_text(f"{prefix}test_known_failure\tany\tfails\tstand-in\n{prefix}test_fixed_since\tcpu\tfails\t"
                        f"stand-in\n{prefix}test_not_run\tany\tdeselect\tstand-in\n")
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "apex"), "--suite", "run_fp16util",
                             "--expected", str(expected)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert f"FAILED  {prefix}test_new_failure" in lines
    assert any(line.startswith(f"FAILED  {prefix}test_known_failure  [expected fails") for line in lines)
    assert any(line.startswith(f"STALE   {prefix}test_fixed_since") for line in lines)
    assert "1 unexpected failure(s)" in lines
    assert not any("test_not_run" in line for line in lines if not line.startswith("=="))  # only deselected
    assert "run_fp16util: 2 passed, 2 failed" in result.stdout


def _stand_in(root, suite, body):
    folder = root / "apex" / "tests" / "L0" / suite
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_stand_in.py").write_text(textwrap.dedent(body))
    return folder / "test_stand_in.py"


def test_cuda_mode_runs_apex_tests_unported_and_collects_without_a_gpu(tmp_path):
    body = """\
        import unittest
        import torch

        class TestOnGpu(unittest.TestCase):
            def test_cuda(self):
                self.assertEqual(torch.ones(1).cuda().device.type, "cuda")
            def test_other(self):
                pass
    """
    _stand_in(tmp_path, "run_fp16util", body)
    keep = tmp_path / "kept"
    command = [sys.executable, str(SCRIPT), str(tmp_path / "apex"), "--device", "cuda", "--suite", "run_fp16util",
               "--keep", str(keep)]
    collected = subprocess.run(command + ["--collect-only"], capture_output=True, text=True, timeout=300)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert "run_fp16util: 2 collected (unported)" in collected.stdout
    assert ".cuda()" in (keep / "tests" / "L0" / "run_fp16util" / "test_stand_in.py").read_text()  # as apex wrote it
    if not _torch_has_cuda():
        refused = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert refused.returncode == 1 and "torch sees no CUDA device" in refused.stderr


def _torch_has_cuda():
    import torch

    return torch.cuda.is_available()


@pytest.mark.slow
def test_a_suite_past_its_timeout_is_stopped_judged_on_what_finished_and_the_next_still_runs(tmp_path):
    _stand_in(tmp_path, "run_amp", """\
        import time
        import unittest

        class TestStall(unittest.TestCase):
            def test_a_finishes(self):
                pass
            def test_b_stalls(self):
                time.sleep(120)
    """)
    _stand_in(tmp_path, "run_fp16util", """\
        import unittest

        class TestQuick(unittest.TestCase):
            def test_quick(self):
                pass
    """)
    (tmp_path / "none.tsv").write_text("# nothing expected\n")
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "apex"), "--suite", "run_amp", "--suite",
                             "run_fp16util", "--timeout", "20", "--test-timeout", "5",
                             "--log-dir", str(tmp_path / "logs"), "--expected", str(tmp_path / "none.tsv")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "run_amp: 1 passed" in result.stdout and "run_fp16util: 1 passed" in result.stdout
    assert "suites stopped at their timeout (their finished tests are judged above): run_amp" in result.stdout
    stall_log = (tmp_path / "logs" / "run_amp.log").read_text()
    assert "Timeout (0:00:05)!" in stall_log and "test_b_stalls" in stall_log  # faulthandler's stack of the stall

