"""apex's register_half_function/register_float_function under migrate (apexlite.migrate.custom_casts): the table
of torch.autocast's CUDA ops against the installed torch's own lists, and each form of registration against what
migrate does with it (dropped with a note only where autocast on CUDA already runs that op in that precision)."""
import re
from pathlib import Path
from typing import Dict, Optional, Set

import pytest
import torch

from apexlite.migrate.custom_casts import FLOAT32, LOWER, cuda_op_precisions
from apexlite.migrate.engine import migrate_source

HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
MACROS = {LOWER: ("AT_FORALL_LOWER_PRECISION_FP",), FLOAT32: ("AT_FORALL_FP32", "AT_FORALL_FP32_SET_OPT_DTYPE")}
NEWER_THAN_THE_FLOOR = {"rms_norm"}  # on autocast's float32 list since torch 2.6: not in the table


def header_lists() -> Optional[Dict[str, Set[str]]]:
    """The op names of torch.autocast's CUDA lists in the installed torch's ATen header, by precision; None
    where the wheel ships no header."""
    if not HEADER.is_file():
        return None
    text = HEADER.read_text()
    lists = {}
    for precision, macros in MACROS.items():
        names = set()
        for macro in macros:
            body = re.search(rf"#define {macro}\(_\)(.*?)\n\n", text, re.S)
            assert body is not None, f"{macro} is not in {HEADER}"
            names |= set(re.findall(r"_\((\w+)", body[1]))
        lists[precision] = names
    return lists


def _lists() -> Dict[str, Set[str]]:
    lists = header_lists()
    if lists is None:
        pytest.skip(f"this torch ships no {HEADER}")
    return lists


def test_each_op_of_the_table_is_on_the_installed_torchs_list_of_its_precision():
    lists = _lists()
    wrong = {op: precision for op, precision in cuda_op_precisions().items() if op not in lists[precision]}
    assert wrong == {}


def test_the_table_holds_every_public_op_of_the_installed_torchs_lists_but_those_newer_than_the_floor():
    lists = _lists()
    table = cuda_op_precisions()
    missing = {op for names in lists.values() for op in names if not op.startswith("_") and op not in table}
    assert missing <= NEWER_THAN_THE_FLOOR


CUDA_SCRIPT = """import torch
import torch.nn.functional as F
from apex import amp
{registration}
model = torch.nn.Linear(4, 4).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
loss = model(torch.randn(2, 4).cuda()).sum()
with amp.scale_loss(loss, optimizer) as scaled_loss:
    scaled_loss.backward()
optimizer.step()
"""
# registration -> the words of the note (dropped) or of the TODO (kept) migrate writes for it
CASES = {
    'amp.register_half_function(torch, "einsum")': "removed: torch.autocast on CUDA already runs torch.einsum in its "
                                                   "lower precision",
    'amp.register_half_function(torch.Tensor, "matmul")': "already runs torch.Tensor.matmul in its lower precision",
    'amp.register_float_function(F, "softplus")': "already runs torch.nn.functional.softplus in float32",
    'amp.register_float_function(torch, "softmax")': "already runs torch.softmax in float32",
    # not what autocast does with the op, not an op of its lists, not a torch namespace, not a literal name
    'amp.register_float_function(torch, "einsum")': "TODO: `amp.register_float_function` has no certain torch rewrite",
    'amp.register_half_function(torch, "sigmoid")': "TODO: `amp.register_half_function` has no certain torch rewrite",
    'amp.register_half_function(model_ops, "einsum")': "TODO: `amp.register_half_function` has no certain",
    'amp.register_half_function(torch, NAME)': "TODO: `amp.register_half_function` has no certain torch rewrite",
}


@pytest.mark.parametrize("registration", list(CASES))
def test_a_registration_is_dropped_only_where_autocast_on_cuda_already_does_it(registration):
    prelude = "model_ops = torch\nNAME = 'einsum'\n"
    result = migrate_source(CUDA_SCRIPT.format(registration=prelude + registration).encode())
    migrated = result.migrated.decode()
    expected = CASES[registration]
    if expected.startswith("TODO: "):
        assert result.exit_status == 1
        assert any(expected[len("TODO: "):] in todo.message for todo in result.todos), result.todos
        assert registration in migrated
    else:
        assert result.exit_status == 0, result.todos
        assert not any(registration in line for line in migrated.splitlines() if not line.lstrip().startswith("#"))
        assert expected in " ".join(line.strip("# ") for line in migrated.splitlines() if line.lstrip().startswith("#"))


def test_a_registration_in_a_script_whose_device_is_chosen_at_run_time_stays_with_a_todo_that_says_when_it_can_go():
    source = CUDA_SCRIPT.format(registration='amp.register_half_function(torch, "einsum")')
    source = source.replace(".cuda()", ".to(device)").replace("import torch\n", "import sys\nimport torch\n"
                                                              "device = sys.argv[1]\n", 1)
    result = migrate_source(source.encode())
    assert result.exit_status == 1
    assert [todo.message for todo in result.todos if "einsum" in todo.message] == [
        "torch.autocast on CUDA already runs torch.einsum in its lower precision (float16, or bfloat16 where the "
        "script asks for it), but this script may run elsewhere, where autocast's lists differ: delete this line if "
        "it trains on CUDA only, else cast the op's inputs where it is called"]
