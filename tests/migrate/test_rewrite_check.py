"""Python's symbol tables find the names a source reads and binds nowhere (the check a rewrite must pass)."""
import builtins

import pytest

from apexlite.migrate import rewrite_check


@pytest.mark.parametrize("source,unbound", [
    ("x = 1\nprint(x)\n", set()),
    ("print(scaler)\n", {"scaler"}),
    ("def f():\n    return scaler.scale(1)\n", {"scaler"}),  # read in a function, bound nowhere
    ("def f():\n    return scaler\nscaler = 1\n", set()),  # bound later at module level: fine when f runs
    ("def f():\n    global scaler\n    scaler = 1\ndef g():\n    return scaler\n", set()),
    ("def f():\n    scaler = 1\n    return scaler\nprint(scaler)\n", {"scaler"}),  # a local binds nothing outside
    ("def outer():\n    s = 1\n    def inner():\n        return s\n    return inner\n", set()),  # a free name
    ("class C:\n    a = 1\n    b = a + missing\n", {"missing"}),
    ("values = [item for item in range(3)]\nprint(item)\n", {"item"}),  # the comprehension's own scope
    ("import torch.nn as nn\nfrom os import path\nprint(nn, path, len, __file__, __name__)\n", set()),
    ("try:\n    pass\nexcept Exception as error:\n    print(error)\n", set()),
    ("for step in range(2):\n    pass\nwith open(__file__) as handle:\n    print(step, handle)\n", set()),
])
def test_symbol_tables_find_names_read_and_bound_nowhere(source, unbound):
    """Flow-insensitive, which is enough for the import pass (it only edits imports): a binding anywhere in the
    right scope counts."""
    read_unbound, _ = rewrite_check.symbols(source.encode())
    assert read_unbound - set(dir(builtins)) - {"__file__", "__name__"} == unbound
