"""`python -m apexlite check PATH...`: which apex APIs scripts use and how apexlite handles each.

A PATH is a script, a Jupyter notebook (its code cells read as one program: apexlite.script_program) or
a folder of them (apexlite.script_paths); a file Python would not run is refused with one line. What
is found, and each API's status, comes from apexlite.apex_uses (the scripts are parsed, never run).
The exit status is 1 when any API used is unsupported, refused at import, or raises at O1, or when a call
raises whatever the run (an amp.initialize option apexlite refuses: apexlite.initialize_scan); `--json`
prints the report as JSON. With several files, the files that use apex are listed, the rest counted,
and the status is the highest.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Tuple

from apexlite import api_status
from apexlite.apex_uses import Row, scan, status_of
from apexlite.help_text import HelpFormatter
from apexlite.script_paths import Collection, collect, skipped_summary
from apexlite.script_program import Program, load_program
from apexlite.script_source import MAX_SOURCE_BYTES, NotPythonSource, ScriptSourceError
from apexlite.switches import help_section
from apexlite.wording import counted

__all__ = ["main", "report", "scan", "status_of"]  # scan and status_of stay importable from here

EXIT_STATUSES = (
    (0, "every apex API used is supported (possibly with differences)"),
    (1, "an API or call used is unsupported, refused at import, or raises"),
    (2, "usage error, or the script is missing or cannot be opened"),
    (3, "the file is not Python source Python would run (nor a Python notebook)"),
    (4, "the path is not a regular file or folder (device, FIFO, socket)"),
    (5, f"the file is larger than {MAX_SOURCE_BYTES} bytes"),
)
READS = ("PATH may be a script, a Jupyter notebook (its code cells, read as one program) or a folder (every "
         ".py and .ipynb under it, skipping hidden folders, environments, build and dist).")
def _parser() -> argparse.ArgumentParser:
    epilog = "exit status:\n" + "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_STATUSES)
    epilog += ("\n  with several files, the highest status of any of them\n\n" + READS + "\n\n" + help_section("check"))
    parser = argparse.ArgumentParser(prog="python -m apexlite check", epilog=epilog, formatter_class=HelpFormatter,
                                     description="List the apex APIs scripts use and their status in apexlite "
                                                 "(the scripts are read, not run).")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a script, a notebook, or a folder of them")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return parser


def _counts(rows: List[Row]) -> Dict[str, int]:
    return {kind: sum(status.split(":", 1)[0] == kind for _, _, status in rows) for kind in api_status.KINDS}


def _exit_status(rows: List[Row]) -> int:
    return 1 if any(api_status.is_failing(status) for _, _, status in rows) else 0


def report(script: str, rows: List[Row], program: Optional[Program] = None) -> Dict[str, Any]:
    """The JSON report: every API with its lines, status and note, the counts, and the exit status.
    In a notebook each line is [cell, line in that cell]."""
    apis = []
    for name, lines, status in rows:
        kind, _, note = status.partition(": ")
        where = [list(program.notebook.cell_of_line(line, program.source)) for line in lines] \
            if program is not None and program.notebook is not None else lines
        apis.append({"api": name, "lines": where, "status": kind, "note": note})
    return {"script": script, "apis": apis, "counts": _counts(rows), "exit_status": _exit_status(rows)}


def _print_text(script: str, rows: List[Row], program: Optional[Program] = None) -> None:
    if not rows:
        print(f"{script}: no apex APIs used")
        return
    width = max(len(name) for name, _, _ in rows)
    print(f"{script}: {counted(len(rows), 'API')} to know about")
    for name, lines, status in rows:
        if program is not None and program.notebook is not None:
            where = ", ".join(program.location(line) for line in lines)
        else:
            where = "line " + ",".join(str(line) for line in lines)
        print(f"  {name:{width}}  {where}: {status}")
    counts = _counts(rows)
    summary = (f"{counts[api_status.SUPPORTED] + counts[api_status.DIFFERS]} supported or supported with "
               f"differences, {counts[api_status.UNSUPPORTED]} unsupported, {counts[api_status.REFUSED]} refused "
               "at import")
    if counts[api_status.RAISES_AT_O1]:
        summary += f", {counts[api_status.RAISES_AT_O1]} raise at O1 with fp16/bf16 inputs (see the fix above)"
    if counts[api_status.RAISES]:
        summary += f", {counts[api_status.RAISES]} raise when they run as written (see above)"
    print(summary)


def _check_one(path: str) -> Tuple[Optional[Program], List[Row], int, Optional[str]]:
    """(program, rows, exit status, error line) of one file."""
    try:
        program = load_program(path)
        return program, scan(program.source, path), 0, None
    except ScriptSourceError as error:
        return None, [], error.exit_status, str(error)
    except RecursionError:
        return None, [], NotPythonSource.exit_status, f"{path} is nested too deeply to analyse"


def _main_one(path: str, as_json: bool) -> int:
    program, rows, status, error = _check_one(path)
    if error is not None:
        sys.stderr.write(f"apexlite check: {error}\n")
        if as_json:  # the same entry a folder's report gives a refused file
            print(json.dumps({"script": path, "error": error, "exit_status": status}, indent=2))
        return status
    if as_json:
        print(json.dumps(report(path, rows, program), indent=2))
    else:
        _print_text(path, rows, program)
    return _exit_status(rows)


def _main_many(found: Collection, as_json: bool) -> int:
    """Every file's report (files without apex APIs only counted in text), a summary, the highest status."""
    reports, statuses, using, refused = [], [], 0, 0
    for target in found.targets:
        program, rows, status, error = _check_one(target.path)
        if error is None:
            status = _exit_status(rows)
            using += bool(rows)
        else:
            refused += 1
        statuses.append(status)
        if as_json:
            reports.append({"script": target.path, "error": error, "exit_status": status} if error is not None
                           else report(target.path, rows, program))
        elif error is not None:
            print(f"{target.path}: refused: {error}")
        elif rows:
            _print_text(target.path, rows, program)
    skipped = skipped_summary(found)
    exit_status = max(statuses, default=0)
    if as_json:
        print(json.dumps({"files": reports, "skipped": skipped, "exit_status": exit_status}, indent=2))
        return exit_status
    total = len(found.targets)
    print(f"total: {counted(total, 'file')} read: {using} use apex APIs, {total - using - refused} use none, "
          f"{refused} refused" + (f"; {skipped}" if skipped else ""))
    return exit_status


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite check`."""
    args = _parser().parse_args(argv)
    found = collect(args.paths)
    if not found.targets:
        sys.stderr.write(f"apexlite check: no Python scripts or notebooks (.py, .ipynb) under "
                         f"{', '.join(found.folders)}\n")
        return 2
    if not found.several:
        return _main_one(found.targets[0].path, args.json)
    return _main_many(found, args.json)
