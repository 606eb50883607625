"""Issue 18 item 4: walking a wrapped call's arguments never crashes the process, on either cast path.

Every check runs in a child process, so a crash (a signal) fails the test instead of ending the run.
Deep and self-containing structures raise RecursionError, as Python's own recursion does; containers
that change while they are walked, from the same thread or another one, give some Python-level result.
"""
import textwrap

import pytest

from apexlite.amp.o1 import native_casts
from tests._helpers.child_process import run_on_cast_path as run_child

PATHS = ["native", "python"]


RECURSION_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import torch.nn.functional as F
    from apexlite import amp

    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    a = torch.randn(2, 2)

    def nested(levels, wrap):
        value = a
        for _ in range(levels):
            value = wrap(value)
        return value

    def self_list():
        box = [a]
        box.append(box)
        return box

    def self_dict():
        box = {"a": a}
        box["self"] = (box,)
        return box

    structures = {
        "list 50000 deep": lambda: nested(50000, lambda v: [v]),
        "tuple 50000 deep": lambda: nested(50000, lambda v: (v,)),
        "dict 50000 deep": lambda: nested(50000, lambda v: {"k": v}),
        "list containing itself": self_list,
        "dict containing itself through a tuple": self_dict,
    }
    ops = {
        "low precision (torch.mm)": lambda arg: torch.mm(a, arg),
        "low precision, keyword (F.linear)": lambda arg: F.linear(a, weight=arg),
        "fp32 (torch.exp)": lambda arg: torch.exp(arg),
        "promote (torch.addcmul)": lambda arg: torch.addcmul(a, arg, a),
        "sequence promote (torch.cat)": lambda arg: torch.cat([a.half(), arg]),
        "method (Tensor.matmul)": lambda arg: a.matmul(arg),
    }
    for structure_name, build in structures.items():
        for op_name, op in ops.items():
            try:
                op(build())
                outcome = "returned"
            except Exception as exc:
                outcome = type(exc).__name__
            print(f"{structure_name} | {op_name} | {outcome}")
    amp.deinitialize()
""")


@pytest.mark.parametrize("path", PATHS)
def test_deep_and_self_containing_arguments_raise_recursion_error(path):
    lines = run_child(path, ["-c", RECURSION_SCRIPT]).stdout.strip().splitlines()
    assert len(lines) == 5 * 6
    outcomes = {line.rsplit(" | ", 1)[0]: line.rsplit(" | ", 1)[1] for line in lines}
    assert set(outcomes.values()) == {"RecursionError"}, outcomes


MUTATION_SCRIPT = textwrap.dedent("""
    from unittest import mock
    import torch
    from apexlite import amp

    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    a = torch.randn(2, 2)

    class Clearing:
        '''Empties its list (or dict) when the walk asks for its class.'''
        def __init__(self, box):
            self.box = box
        def __getattribute__(self, name):
            if name == "__class__":
                object.__getattribute__(self, "box").clear()
            return object.__getattribute__(self, name)

    def cleared_list():
        box = [a, a, None, a, a, a]
        box[2] = Clearing(box)
        return box

    def cleared_dict():
        box = {"a": a, "b": a}
        box["c"] = Clearing(box)
        box.update({f"k{i}": a for i in range(20)})
        return box

    ops = {
        "torch.linalg.multi_dot": lambda arg: torch.linalg.multi_dot(arg),
        "torch.cat": lambda arg: torch.cat(arg),
        "torch.addcmul": lambda arg: torch.addcmul(a, a, a, value=arg),
        "torch.mm": lambda arg: torch.mm(a, a, alpha=arg),
    }
    for name, build in [("cleared list", cleared_list), ("cleared dict", cleared_dict),
                        ("mock tensor", lambda: [a, mock.MagicMock(spec=torch.Tensor)])]:
        for op_name, op in ops.items():
            try:
                op(build())
                outcome = "returned"
            except Exception as exc:
                outcome = type(exc).__name__
            print(f"{name} | {op_name} | {outcome}")
    amp.deinitialize()
""")


def test_containers_emptied_during_the_walk_and_mock_tensors_do_not_crash():
    """Both paths survive; and both pass a MagicMock(spec=torch.Tensor), which claims to be a Tensor through
    __class__, on as it is: the Python path asks it for its dtype (not a castable one), the native path
    checks its real type. (An object whose __class__ has side effects may see a different number of
    calls on each path, so only the mock's outcomes are compared.)"""
    paths = [path for path in PATHS if path == "python" or native_casts.use_native()]
    outputs = {path: run_child(path, ["-c", MUTATION_SCRIPT]).stdout.splitlines() for path in paths}
    for lines in outputs.values():
        assert len(lines) == 3 * 4
    mocks = [[line for line in lines if line.startswith("mock tensor")] for lines in outputs.values()]
    assert all(len(lines) == 4 and lines == mocks[0] for lines in mocks)


@pytest.mark.parametrize("path", PATHS)
def test_fuzzed_structures_with_a_mutating_thread_never_crash(path):
    result = run_child(path, ["-m", "tests.amp.o1.argument_fuzz", "20251123", "40"])
    assert result.stdout.startswith("survived")
