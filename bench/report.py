"""Writes a benchmark's markdown into its own marked block of BENCHMARKS.md, leaving other blocks alone."""
from __future__ import annotations

import os


def replace_block(path: str, name: str, text: str) -> None:
    """Replace the text between `<!-- name:begin -->` and `<!-- name:end -->` (appended if absent)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    content = open(path).read() if os.path.exists(path) else "# apexlite benchmarks\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in content and end in content:
        head, rest = content.split(begin, 1)
        content = head + block + rest.split(end, 1)[1]
    else:
        content = content.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as handle:
        handle.write(content)
