"""The oldest torch apexlite supports, and the warning an older one gets on import.

The floor is measured, not guessed: docs/compatibility.md lists what each older torch lacks (torch 2.1:
C++ dispatch-mode API, storage object identity, CPU float16 kernels, a compiler that reads per-thread
state) and the runs that pass from the floor up. pyproject.toml's requirement says the same
(tests/test_torch_floor.py keeps the two equal).
"""
from __future__ import annotations

import re
import warnings
from typing import Optional, Tuple

MIN_TORCH: Tuple[int, int] = (2, 5)


def parse(version: str) -> Tuple[int, int]:
    """(major, minor) of a torch version string such as '2.13.0+cpu' or '2.6.0a0+git1234'."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def unsupported_message(version: str) -> Optional[str]:
    """Why `version` is below the floor, or None when it is supported."""
    if parse(version) >= MIN_TORCH:
        return None
    floor = ".".join(map(str, MIN_TORCH))
    return (f"apexlite supports torch >= {floor}; this is torch {version}, on which parts of it are known to "
            f"fail or compute wrongly (docs/compatibility.md lists them). Upgrade torch: "
            f"pip install 'torch>={floor}'.")


def warn_if_unsupported(version: str) -> None:
    message = unsupported_message(version)
    if message is not None:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
