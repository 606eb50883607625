"""The device type migrated autocast/GradScaler calls use: literal CUDA, never-touched CPU, or read from the
model's parameters when the script decides at run time."""
import libcst
import pytest

from apexlite.migrate.analysis import parse
from apexlite.migrate.device import CPU, CUDA, RUNTIME, built_here, detect
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


def _migrated(prelude, model="torch.nn.Linear(2, 2)"):
    """An O1 script whose model is `model`, after `prelude`, migrated."""
    source = (f"import torch\nfrom apex import amp\nclass Net(torch.nn.Module):\n    pass\n{prelude}\n"
              f"model = {model}\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              "model, opt = amp.initialize(model, opt, opt_level='O1')\n"
              "loss = model(x).sum()\nwith amp.scale_loss(loss, opt) as scaled:\n    scaled.backward()\nopt.step()\n")
    return migrate_source(source.encode()).migrated.decode()


@pytest.mark.parametrize("code,expected", [(c, e) for c, e in CASES if e != CPU][:3] + [("model = Net()", CPU)])
def test_the_migrated_script_uses_it(code, expected):
    code_out = _migrated(code)
    assert f'torch.amp.GradScaler("{expected}")' in code_out
    assert f'torch.autocast(device_type="{expected}", dtype=torch.float16)' in code_out


def test_runtime_device_comes_from_the_model():
    code = _migrated("", model="torch.nn.Linear(2, 2).to(args.device)")
    assert "amp_device_type = next(model.parameters()).device.type\n" in code
    assert "torch.amp.GradScaler(amp_device_type)" in code
    assert "torch.autocast(device_type=amp_device_type, dtype=torch.float16)" in code


BUILT = [
    ("model = torch.nn.Linear(2, 2)", True),
    ("from torch import nn\nmodel = nn.Sequential(nn.Linear(2, 2))", True),
    ("class Net(torch.nn.Module):\n    pass\nmodel = Net()\nmodel = model.float()", True),
    ("from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(torch.nn.Linear(2, 2))", True),
    ("from models import create_model\nmodel = create_model(opt)", False),
    ("import torchvision\nmodel = torchvision.models.resnet18()", False),
    ("model = torch.nn.Linear(2, 2)\nmodel = load(path)", False),
    ("model = models[name]", False),
]


@pytest.mark.parametrize("code,expected", BUILT)
def test_a_model_built_elsewhere_may_be_anywhere(code, expected):
    """A script that names no device trains on the CPU only if it builds its models itself; a model from
    another module's factory may have been moved to the GPU there."""
    _, analysis = parse(f"import torch\n{code}\n".encode())
    model = next(node for node in analysis.nodes(libcst.Name) if node.value == "model")
    assert built_here(analysis, model) is expected


def test_a_model_from_a_factory_reads_its_device_at_run_time():
    code = _migrated("from models import create_model", model="create_model(opt)")
    assert "torch.amp.GradScaler(amp_device_type)" in code
