"""LayerDtypes: the dtypes Linear/Conv layers return, by grad mode, counted by one process-wide hook that is
removed again; APEXLITE_LAYER_DTYPES=FILE counts a whole process and writes FILE at exit."""
import json
import os
import subprocess
import sys

import pytest
import torch

from apexlite.amp.layer_precision import LAYER_DTYPES_ENV, LayerDtypes, low_share

LAYERS = [torch.nn.Linear(4, 4), torch.nn.Conv1d(4, 4, 1), torch.nn.Conv2d(4, 4, 1)]
INPUTS = [torch.randn(2, 4), torch.randn(2, 4, 3), torch.randn(2, 4, 3, 3)]


@pytest.mark.parametrize("layer,inputs", list(zip(LAYERS, INPUTS)), ids=["linear", "conv1d", "conv2d"])
def test_counts_what_each_layer_returns_by_grad_mode(layer, inputs):
    counter = LayerDtypes()
    counter.install()
    try:
        layer(inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layer(inputs)
            with torch.no_grad():
                layer(inputs)
        torch.nn.ReLU()(inputs)  # not a Linear/Conv layer: not counted
    finally:
        counter.uninstall()
    layer(inputs)  # after uninstall: not counted
    assert counter.counts == {"training": {"torch.float32": 1, "torch.bfloat16": 1}, "no_grad": {"torch.bfloat16": 1}}


def test_uninstall_leaves_torchs_global_hooks_as_found():
    before = dict(torch.nn.modules.module._global_forward_hooks)
    counter = LayerDtypes()
    counter.install()
    assert len(torch.nn.modules.module._global_forward_hooks) == len(before) + 1
    counter.uninstall()
    assert dict(torch.nn.modules.module._global_forward_hooks) == before


@pytest.mark.parametrize("counts,share", [({}, None), ({"torch.float32": 3}, 0.0),
                                          ({"torch.float16": 1, "torch.bfloat16": 1, "torch.float32": 2}, 0.5)])
def test_low_share(counts, share):
    assert low_share(counts) == share


def test_the_switch_counts_a_process_once_and_writes_its_file_at_exit(tmp_path):
    """Asked twice (verify_child under apexlite run), one counter; the variable is gone for child processes."""
    path = tmp_path / "layers.json"
    code = ("import os, torch\nfrom apexlite.amp.layer_precision import install_from_environment\n"
            "assert install_from_environment() is not None\nassert install_from_environment() is None\n"
            f"assert {LAYER_DTYPES_ENV!r} not in os.environ\n"
            "layer = torch.nn.Linear(2, 2)\nwith torch.autocast('cpu', dtype=torch.bfloat16):\n    layer(torch.ones(1, 2))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env={**os.environ, LAYER_DTYPES_ENV: str(path)})
    assert json.loads(path.read_text()) == {"training": {"torch.bfloat16": 1}, "no_grad": {}}
