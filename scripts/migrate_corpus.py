"""Run `apexlite migrate` over checkouts of real repositories and report, per file, what it made of it.

    python scripts/migrate_corpus.py CHECKOUT... [--json OUT] [--slowest N] [--apex-only]

Every .py and .ipynb under each CHECKOUT (the folders `migrate` itself would take: apexlite.script_paths)
is read and migrated the way `migrate PATH` does (apexlite.migrate.files), one file at a time so each gets
its own time. Nothing is written back. A file's outcome is one of migrate's (migrated / kept on apexlite /
TODOs / not rewritten / unchanged / refused), or CRASH when migrate raised anything but its own refusal; every
migrated output must compile (a notebook's code cells as one program), else it is counted as INVALID.
Both must stay at zero. The table per checkout goes to stdout; --json writes every file's record.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from collections import Counter
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from apexlite.migrate.files import load, migrate_all  # noqa: E402  (the checkout, not an installed copy)
from apexlite.migrate.options import MigrateOptions  # noqa: E402
from apexlite.script_paths import collect  # noqa: E402

CRASH, INVALID = "CRASH", "INVALID"


def _invalid(item) -> bool:
    """Whether the output migrate would write does not compile."""
    if item.result is None or not item.changed:
        return False
    program = item.result.migrated
    try:
        compile(program, item.path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return True
    return False


def migrate_one(target, options: MigrateOptions) -> Dict[str, Any]:
    """One file's record: outcome, seconds, TODOs, lines, and the crash's last frames if it crashed."""
    start = time.perf_counter()
    cpu = time.process_time()
    record: Dict[str, Any] = {"path": target.path}
    try:
        item = load(target)
        migrate_all([item], options)
        record["outcome"] = INVALID if _invalid(item) else item.outcome
        record["todos"] = len(item.result.todos) if item.result is not None else 0
        record["detail"] = item.refusal or item.error
        record["lines"] = item.program.source.count(b"\n") if item.program is not None else None
    except Exception:  # noqa: BLE001  (a crash is what this script exists to find)
        record.update(outcome=CRASH, todos=0, detail=traceback.format_exc(limit=-4), lines=None)
    record["seconds"] = round(time.perf_counter() - start, 3)
    record["cpu_seconds"] = round(time.process_time() - cpu, 3)
    return record


def mentions_apex(path: str) -> bool:
    with open(path, "rb") as handle:
        data = handle.read()
    return b"apex" in data or b"amp_C" in data


def run(checkout: str, options: MigrateOptions, apex_only: bool) -> List[Dict[str, Any]]:
    found = collect([checkout])
    records = []
    for target in found.targets:
        if apex_only and not mentions_apex(target.path):
            continue
        record = migrate_one(target, options)
        record["apex"] = mentions_apex(target.path)
        records.append(record)
    return records


def table(results: Dict[str, List[Dict[str, Any]]]) -> str:
    outcomes = ["migrated", "kept on apexlite", "TODOs", "not rewritten", "unchanged", "refused", CRASH, INVALID]
    lines = ["| checkout | files | naming apex | " + " | ".join(outcomes) + " | TODOs | CPU s (all) | slowest s |",
             "|---|---:|---:|" + "---:|" * len(outcomes) + "---:|---:|---:|"]
    for checkout, records in results.items():
        counts = Counter(record["outcome"] for record in records)
        slowest = max((record["cpu_seconds"] for record in records), default=0.0)
        lines.append(f"| {os.path.basename(os.path.normpath(checkout))} | {len(records)} | "
                     f"{sum(record['apex'] for record in records)} | "
                     + " | ".join(str(counts.get(outcome, 0)) for outcome in outcomes)
                     + f" | {sum(record['todos'] for record in records)} | "
                       f"{sum(record['cpu_seconds'] for record in records):.1f} | {slowest:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkouts", nargs="+")
    parser.add_argument("--json", metavar="OUT", help="write every file's record to OUT")
    parser.add_argument("--slowest", type=int, default=10, help="list the N slowest files")
    parser.add_argument("--apex-only", action="store_true", help="only the files that name apex or amp_C")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    options = MigrateOptions()
    results = {checkout: run(checkout, options, args.apex_only) for checkout in args.checkouts}
    print(table(results))
    everything = [record for records in results.values() for record in records]
    bad = [record for record in everything if record["outcome"] in (CRASH, INVALID)]
    for record in bad:
        print(f"\n{record['outcome']} {record['path']}:\n{record['detail']}")
    print("\nslowest files (CPU s, lines):")
    for record in sorted(everything, key=lambda r: -r["cpu_seconds"])[:args.slowest]:
        print(f"  {record['cpu_seconds']:7.2f}  {record['lines']}  {record['path']}  ({record['outcome']})")
    not_rewritten = [record for record in everything if record["outcome"] == "not rewritten"]
    for record in not_rewritten:
        print(f"not rewritten {record['path']}: {record['detail']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
