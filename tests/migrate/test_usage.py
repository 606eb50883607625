"""What the rewritten code still reads of each import (apexlite.migrate.usage), scope by scope, against
what Python itself would resolve: the import pass removes an apex import exactly when nothing reads it."""
import pytest

from apexlite.migrate.usage import usage_of

CASES = [
    ("read at module level", "from apex import amp\namp.initialize()\n", [(True,)]),
    ("never read", "from apex import amp\nx = 1\n", [(False,)]),
    ("read in a function (global)", "from apex import amp\ndef f():\n    return amp\n", [(True,)]),
    ("a function's own binding shadows it", "from apex import amp\ndef f(amp):\n    return amp\n", [(False,)]),
    ("a function-local import read elsewhere only",
     "from apex import amp\namp.x()\ndef f():\n    from apex import amp\n    return 1\n", [(True,), (False,)]),
    ("a function-local import read in a nested function",
     "def f():\n    from apex import amp\n    def g():\n        return amp\n    return g\n", [(True,)]),
    ("a class body's import is not seen by its methods",
     "class C:\n    from apex import amp\n    def m(self):\n        return amp\n", [(False,)]),
    ("import a.b binds a", "import apex.amp\napex.amp.x()\n", [(True,)]),
    ("an alias binds its own name", "import apex.amp as a\nprint(apex)\n", [(False,)]),
    ("one name of two", "from apex.optimizers import FusedAdam, FusedSGD\nFusedSGD()\n", [(False, True)]),
    ("a postponed annotation", "from __future__ import annotations\nfrom apex import amp\ndef f(x: amp.T) -> None:\n"
                               "    pass\n", [(False,), (True,)]),  # (the __future__ import binds nothing read)
    ("a string annotation", "from apex.optimizers import FusedAdam\nx: \"FusedAdam\" = None\n", [(True,)]),
    ("a cast to a string type", "from typing import cast\nfrom apex.x import Y\nz = cast(\"Y\", 1)\n",
     [(True,), (True,)]),
    ("a star import counts as read", "from apex.fp16_utils import *\n", [(True,)]),
    # an import in one branch is read only by code that can run after it: not the other branch, with its own
    ("an import read only in the other branch", "def f(a):\n    if a:\n        from apex.parallel import D\n"
     "        x = 1\n    else:\n        from torch.nn.parallel import D\n        x = D()\n    return x\n",
     [(False,), (True,)]),
    ("an import in a branch read after the if", "def f(a):\n    if a:\n        from apex import amp\n"
     "    else:\n        amp = None\n    return amp\n", [(True,)]),
    ("an import in a loop read at the top of the next iteration", "for i in range(2):\n    if i:\n"
     "        print(amp)\n    from apex import amp\n", [(True,)]),
    ("an import in a try read by a function defined before it", "def f():\n    return amp\ntry:\n"
     "    from apex import amp\nexcept ImportError:\n    pass\n", [(True,)]),
]


@pytest.mark.parametrize("code,expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_import_is_used_where_python_would_resolve_it(code, expected):
    usage = usage_of(code.encode())
    assert [found.used for found in usage.imports] == expected


def test_the_import_statements_come_in_source_order_with_their_names():
    usage = usage_of(b"import os\ndef f():\n    from apex import amp, optimizers\nimport apex.amp as a\n")
    assert [found.names for found in usage.imports] == [("os",), ("amp", "optimizers"), ("apex.amp",)]
    assert usage.module_bound >= {"os", "a", "f"} and "amp" not in usage.module_bound


def test_code_python_cannot_parse_has_no_usage():
    assert usage_of(b"def f(:\n") is None
