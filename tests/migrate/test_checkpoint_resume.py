"""A migrated script resumes from a checkpoint the apex script wrote before the migration (apex's scaler
state, {'loss_scaler0': {'loss_scale', 'unskipped'}}), and from one it wrote itself (GradScaler's)."""
import os
import subprocess
import sys
from pathlib import Path

import torch

GOLDEN = Path(__file__).with_name("golden")


def _run(script, cwd):
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=cwd, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_migrated_golden_resumes_from_apex_form_and_its_own(tmp_path):
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    apex_state = {"loss_scaler0": {"loss_scale": 128.0, "unskipped": 5}}  # what apex's amp.state_dict() saved
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": apex_state},
               tmp_path / "resume.pt")
    migrated = tmp_path / "checkpoint.py"
    migrated.write_text((GOLDEN / "checkpoint.out.py").read_text())
    _run(migrated, tmp_path)  # 3 steps, no overflow at a scale of 128
    own = torch.load(tmp_path / "resume.pt")["amp"]
    assert (own["scale"], own["_growth_tracker"]) == (128.0, 8)  # apex's scale and count, carried on
    _run(migrated, tmp_path)
    own = torch.load(tmp_path / "resume.pt")["amp"]
    assert (own["scale"], own["_growth_tracker"]) == (128.0, 11)
