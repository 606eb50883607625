"""Counts in report lines, spelled as a reader writes them ("1 file", "3 files", never "3 file(s)")."""
from __future__ import annotations

from typing import Optional


def counted(count: int, noun: str, plural: Optional[str] = None) -> str:
    """`count` and `noun`, the noun in the plural unless the count is exactly one."""
    return f"{count} {noun if count == 1 else (plural or noun + 's')}"
