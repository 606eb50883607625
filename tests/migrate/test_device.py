"""The device type migrated autocast/GradScaler calls use: literal CUDA, never-touched CPU, or read from the
model's parameters when the script decides at run time."""
import pytest

from apexlite.migrate.analysis import parse
from apexlite.migrate.device import CPU, CUDA, RUNTIME, detect
from apexlite.migrate.engine import migrate_source

CASES = [
    ("model = Net().cuda()", CUDA),
    ("model = Net().cuda(args.local_rank)", CUDA),
    ("x = x.to('cuda:1', non_blocking=True)", CUDA),
    ("x = x.to(device='cuda')", CUDA),
    ("device = torch.device('cuda')", CUDA),
    ("x = torch.zeros(3, device='cuda:0')", CUDA),
    ("x = x.to(0)", CUDA),
    ("model = Net()", CPU),
    ("x = torch.zeros(3, device='cpu')", CPU),
    ("x = x.to(torch.float16)", CPU),
    ("x = x.to(dtype=torch.bfloat16)", CPU),
    ("model = Net().to(args.device)", RUNTIME),
    ("device = torch.device(name)", RUNTIME),
    ("use = torch.cuda.is_available()", RUNTIME),
    ("model = Net().cuda()\nx = x.to('cpu')", RUNTIME),
    ("x = torch.zeros(3, device=where)", RUNTIME),
]


@pytest.mark.parametrize("code,expected", CASES)
def test_detect(code, expected):
    _, analysis = parse(f"import torch\n{code}\n".encode())
    assert detect(analysis) == expected


@pytest.mark.parametrize("code,expected", [(c, e) for c, e in CASES if e != CPU][:3] + [("model = Net()", CPU)])
def test_the_migrated_script_uses_it(code, expected):
    source = (f"import torch\nfrom apex import amp\n{code}\nmodel = torch.nn.Linear(2, 2)\n"
              "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              "model, opt = amp.initialize(model, opt, opt_level='O1')\n"
              "loss = model(x).sum()\nwith amp.scale_loss(loss, opt) as scaled:\n    scaled.backward()\nopt.step()\n")
    code_out = migrate_source(source.encode()).migrated.decode()
    assert f'torch.amp.GradScaler("{expected}")' in code_out
    assert f'torch.autocast(device_type="{expected}", dtype=torch.float16)' in code_out


def test_runtime_device_comes_from_the_model():
    source = ("import torch\nfrom apex import amp\nmodel = torch.nn.Linear(2, 2).to(args.device)\n"
              "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              "model, opt = amp.initialize(model, opt, opt_level='O1')\n"
              "loss = model(x).sum()\nwith amp.scale_loss(loss, opt) as scaled:\n    scaled.backward()\nopt.step()\n")
    code = migrate_source(source.encode()).migrated.decode()
    assert "amp_device_type = next(model.parameters()).device.type\n" in code
    assert "torch.amp.GradScaler(amp_device_type)" in code
    assert "torch.autocast(device_type=amp_device_type, dtype=torch.float16)" in code
