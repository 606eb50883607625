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
            scaler = torch.amp.GradScaler('cuda', enabled=True)
        skip = torch.cuda.device_count() < 2
    """))
    assert _load_script().port_file(source, "bfloat16") == 9
    assert source.read_text() == textwrap.dedent("""\
        model = Model().cpu()
        a = torch.FloatTensor(3).fill_(1); HALF = 'torch.HalfTensor'
        torch.manual_seed(1); torch.cpu.synchronize()
        x = torch.ones(2, device='cpu'); y = x.to('cpu')
        with torch.amp.autocast('cpu', dtype=torch.bfloat16, enabled=True):
            scaler = torch.amp.GradScaler('cpu', enabled=True)
        skip = torch.cuda.device_count() < 2
    """)


def test_shipped_expectations_parse():
    table = _load_script().read_expectations()
    assert {e.kind for e in table.values()} <= {"fails", "flaky", "deselect"}
    assert all(nodeid.split("/")[0] in ("run_amp", "run_optimizers", "run_fp16util") for nodeid in table)


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
    expected.write_text(f"{prefix}test_known_failure\tfails\tstand-in\n{prefix}test_fixed_since\tfails\tstand-in\n"
                        f"{prefix}test_not_run\tdeselect\tstand-in\n")
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
