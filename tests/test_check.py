"""`python -m apexlite check`: static listing of apex APIs with their apexlite status."""
import subprocess
import sys
import textwrap
from pathlib import Path

from apexlite import check

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = textwrap.dedent("""
    import sys
    import apex.amp as A
    from apex import amp
    from apex.parallel import DistributedDataParallel as DDP
    from apex.fp16_utils import *
    from apex.contrib.xentropy import SoftmaxCrossEntropyLoss
    from apex.RNN import LSTM
    import amp_C

    open(sys.argv[0] + ".ran", "w").write("executed")  # must never run
    model, opt = A.initialize(None, None, opt_level="O2")
    with amp.scale_loss(1.0, opt) as scaled:
        pass
    amp._amp_state.loss_scalers[0].loss_scale()
    value = to_python_float(scaled)
    handle = amp.init()
    amp.no_such_function()
    amp_C.multi_tensor_l2norm
    print(apex.__version__ if False else DDP)
""")


def _statuses(source):
    return {name: (lines, status) for name, lines, status in check.scan(source)}


def test_scan_classifies_supported_differs_and_unsupported():
    rows = _statuses(SAMPLE)
    assert rows["apex.amp.scale_loss"] == ([13], "supported")
    assert rows["apex.amp.initialize"][1].startswith("differs: ")
    assert rows["apex.amp.initialize"][0] == [12]  # found through the `import apex.amp as A` alias
    assert rows["apex.parallel.DistributedDataParallel"][0] == [5, 20]
    assert rows["apex.parallel.DistributedDataParallel"][1].startswith("differs: built on torch DDP")
    assert rows["apex.fp16_utils.to_python_float"] == ([16], "supported")  # through the star import
    assert rows["apex.amp._amp_state"] == ([15], "supported")
    assert rows["apex.contrib.xentropy"][1].startswith("unsupported: ")
    assert "torch.nn.LSTM" in rows["apex.RNN.LSTM"][1] and rows["apex.RNN.LSTM"][1].startswith("unsupported: ")
    assert rows["apex.amp.init"][1].startswith("unsupported: ") and "amp.initialize" in rows["apex.amp.init"][1]
    assert rows["apex.amp.no_such_function"][1].startswith("unsupported: ")
    assert rows["amp_C.multi_tensor_l2norm"][1].startswith("differs: torch foreach")


def test_cli_reads_without_executing_and_sets_exit_status(tmp_path):
    script = tmp_path / "legacy.py"
    script.write_text(SAMPLE)
    result = subprocess.run([sys.executable, "-m", "apexlite", "check", str(script)], capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1  # unsupported APIs present
    assert not (tmp_path / "legacy.py.ran").exists()
    assert "apex.amp.scale_loss" in result.stdout and "line 13: supported" in result.stdout
    assert "unsupported" in result.stdout


def test_cli_all_supported_example_exits_zero(capsys):
    assert check.main([str(ROOT / "examples" / "fused_adam_o2.py")]) == 0
    out = capsys.readouterr().out
    assert "apex.optimizers.FusedAdam" in out and "0 unsupported" in out


def test_cli_reports_unreadable_script(tmp_path, capsys):
    assert check.main([str(tmp_path / "missing.py")]) == 2
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    assert check.main([str(bad)]) == 2
    assert "cannot read" in capsys.readouterr().err
