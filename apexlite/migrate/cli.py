"""`python -m apexlite migrate PATH... [-o OUT | --diff | --in-place] [--verify [--max-steps N]] [-- ARGS]`.

Imports libcst only after the options are read, so `--help` works without it and a missing extra is
one clear line (exit 2), not a traceback. A PATH is a script, a Jupyter notebook or a folder (every .py
and .ipynb under it: apexlite.script_paths); all files are migrated together (apexlite.migrate.files).
One file: the migrated script goes to stdout (the report then goes to stderr), to OUT, or over SCRIPT
(through a symlink to its target); `--diff` prints a unified diff instead. Several files: one summary
table, and -o names a folder that receives the tree, `--in-place` writes every changed file, `--diff`
prints every diff; with none of them nothing is written. Errors are one line each; the exit statuses
are EXIT_STATUSES (the highest of any file when there are several).
"""
from __future__ import annotations

import argparse
import difflib
import io
import os
import stat
import sys
import tokenize
from typing import Dict, List, Tuple

from apexlite.help_text import HelpFormatter
from apexlite.script_source import file_kind
from apexlite.switches import help_section
from apexlite.wording import counted

INSTALL_HINT = "apexlite migrate needs libcst: pip install 'apexlite[migrate]'"
EXIT_STATUSES = (
    (0, "migrated completely (to native torch.amp, or kept on apexlite: O2's amp, reported as such), or nothing "
        "to migrate (and --verify found it trains like the original)"),
    (1, "TODOs were left, a rewrite was refused as unsound (the original is kept), or --verify disagreed"),
    (2, "bad input (missing, not a regular file, not Python source nor a Python notebook) or bad options, "
        "or libcst is missing"),
    (3, "an output could not be written (permissions, a read-only folder, a full disk, a destination that is not "
        "a regular file: a device, FIFO, socket or directory); what was not written is unchanged"),
)
WRITE_FAILED_STATUS = 3
DEFAULT_MAX_STEPS = 20
DEFAULT_TIMEOUT_S = 600.0


def _parser() -> argparse.ArgumentParser:
    from apexlite.migrate.options import DEFAULT_TOLERANCE, O2_CHOICES

    epilog = "exit status:\n" + "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_STATUSES)
    epilog += "\n  with several files, the highest status of any of them\n\n" + help_section("migrate")
    parser = argparse.ArgumentParser(
        prog="python -m apexlite migrate", formatter_class=HelpFormatter, epilog=epilog,
        usage="python -m apexlite migrate PATH... [-o OUT | --diff | --in-place] [options] [--verify [--max-steps N]]"
              " [-- SCRIPT_ARGS...]",
        description="Rewrite legacy apex.amp scripts into native torch.amp (torch.autocast + torch.amp.GradScaler) "
                    "and torch's optimizers/DDP/norms, keeping everything else byte for byte. Places it cannot "
                    "rewrite with certainty keep their code and get a `# TODO(apexlite migrate): ...` comment. "
                    "PATH is a script, a Jupyter notebook (its code cells, migrated as one program) or a folder "
                    "(every .py and .ipynb under it, skipping hidden folders, environments, build and dist).")
    parser.add_argument("paths", nargs="+", metavar="PATH")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="OUT",
                       help="write the migrated script to OUT (default: stdout); with several files or a folder, "
                            "OUT is a folder that receives them under their relative paths")
    where.add_argument("--diff", action="store_true", help="print a unified diff instead of the script")
    where.add_argument("--in-place", action="store_true",
                       help="overwrite each file that changes (a symlink: the file it points to; the link stays)")
    parser.add_argument("--opt-level", choices=("O0", "O1", "O2", "O3"),
                        help="the opt level to migrate for where the script picks it at run time "
                             "(opt_level=args.opt_level)")
    parser.add_argument("--loss-scale", metavar="dynamic|N",
                        help="the loss scale to migrate for where the script picks it at run time")
    parser.add_argument("--o2", choices=O2_CHOICES, default=O2_CHOICES[0],
                        help="O2: keep amp through `from apexlite import amp` (default), or move to bf16 autocast")
    parser.add_argument("--verify", action="store_true",
                        help="run the original under `apexlite run` and the migrated script under plain python "
                             "(apex not importable) for --max-steps optimizer steps each, and compare the losses")
    parser.add_argument("--max-steps", type=int, metavar="N",
                        help=f"optimizer steps per verify run (default {DEFAULT_MAX_STEPS})")
    parser.add_argument("--tolerance", type=float,
                        help=f"largest relative loss difference verify accepts (default {DEFAULT_TOLERANCE:g}; "
                             "see MIGRATION.md for how it was chosen)")
    parser.add_argument("--timeout", type=float, help=f"seconds per verify run (default {DEFAULT_TIMEOUT_S:g})")
    return parser


def _split(argv: List[str]) -> Tuple[List[str], List[str]]:
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1:]
    return argv, []


def _check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.loss_scale is not None and args.loss_scale != "dynamic":
        try:
            value = float(args.loss_scale)
        except ValueError:
            value = -1.0
        if not value > 0 or value == float("inf"):
            parser.error(f"--loss-scale must be 'dynamic' or a finite number > 0, got {args.loss_scale!r}")
    if args.max_steps < 1:
        parser.error(f"--max-steps must be >= 1, got {args.max_steps}")
    if not 0 <= args.tolerance < float("inf"):
        parser.error(f"--tolerance must be a finite number >= 0, got {args.tolerance}")
    if not 0 < args.timeout < float("inf"):
        parser.error(f"--timeout must be a finite number of seconds > 0, got {args.timeout}")


def parse_arguments(argv: List[str]) -> Tuple[argparse.Namespace, List[str]]:
    """migrate's own options and the script's arguments (after `--`); exits 2 on bad options."""
    own, script_args = _split(list(argv))
    parser = _parser()
    args = parser.parse_args(own)
    if script_args and not args.verify:
        parser.error("arguments after `--` are for the script under --verify; add --verify")
    from apexlite.migrate.options import DEFAULT_TOLERANCE

    verify_only = {"max_steps": DEFAULT_MAX_STEPS, "tolerance": DEFAULT_TOLERANCE, "timeout": DEFAULT_TIMEOUT_S}
    given = [f"--{name.replace('_', '-')}" for name in verify_only if getattr(args, name) is not None]
    if given and not args.verify:
        parser.error(f"{', '.join(given)} only {'applies' if len(given) == 1 else 'apply'} under --verify (nothing "
                     "else reads it); add --verify")
    for name, default in verify_only.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    _check_options(parser, args)
    return args, script_args


def migrate_options(args: argparse.Namespace):
    """The MigrateOptions the parsed command line asks for."""
    from apexlite.migrate.options import MigrateOptions

    return MigrateOptions(opt_level=args.opt_level, loss_scale=args.loss_scale, o2=args.o2)


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite migrate`."""
    args, script_args = parse_arguments(argv)
    try:
        import libcst  # noqa: F401  (the extra is there: everything below may use it)
    except ImportError:
        sys.stderr.write(INSTALL_HINT + "\n")
        return 2
    from apexlite.migrate.files import load, migrate_all
    from apexlite.script_paths import collect

    found = collect(args.paths)
    if not found.targets:
        sys.stderr.write(f"apexlite migrate: no Python scripts or notebooks (.py, .ipynb) under "
                         f"{', '.join(found.folders)}\n")
        return 2
    if found.several and args.verify:
        sys.stderr.write("apexlite migrate: --verify runs one script: name one file\n")
        return 2
    if found.several and args.output and os.path.exists(args.output) and not os.path.isdir(args.output):
        kind = os.stat(args.output).st_mode
        what = "a file" if stat.S_ISREG(kind) else file_kind(kind)
        sys.stderr.write(f"apexlite migrate: -o {args.output}: with several files or a folder, -o names a folder "
                         f"(this is {what}); nothing written\n")
        return 2
    files = [load(target) for target in found.targets]
    options = migrate_options(args)
    migrate_all(files, options)
    if not found.several:
        return _main_one(files[0], args, script_args, options)
    return _main_many(files, found, args)


def _verify(item, args: argparse.Namespace, script_args: List[str], options, migrated_path, out) -> int:
    """--verify's status; its report goes to `out`."""
    if item.program.notebook is not None:
        out.write("verify: skipped: --verify runs scripts, not notebooks\n")
        return 1
    from apexlite.migrate.verify import verify_migration

    return verify_migration(item.path, item.result, script_args, args.max_steps, args.timeout, args.tolerance,
                            options, migrated_path=migrated_path, out=out)


def _main_one(item, args: argparse.Namespace, script_args: List[str], options) -> int:
    from apexlite.migrate.report import format_report
    from apexlite.migrate.writing import WriteError, write_atomically

    if item.refusal is not None:
        sys.stderr.write(f"apexlite migrate: {item.refusal}\n")
        return item.exit_status
    report_stream = sys.stdout if (args.output or args.in_place) else sys.stderr
    status, written, verify_report = item.exit_status, None, io.StringIO()
    if args.verify and args.in_place:  # before the script is overwritten: the original must still be there
        status = max(status, _verify(item, args, script_args, options, None, verify_report))
    if args.diff:
        sys.stdout.writelines(_diff(item, item.path))
        shown_as = item.path
    elif args.output or args.in_place:
        shown_as = args.output or item.path
        if args.output and os.path.isdir(args.output):
            shown_as = os.path.join(args.output, os.path.basename(item.path))
        if args.output or item.changed:
            try:
                written = write_atomically(shown_as, item.output)
            except WriteError as error:
                sys.stderr.write(f"apexlite migrate: {error}\n")
                return WRITE_FAILED_STATUS
            if os.path.islink(shown_as):
                shown_as = f"{shown_as} (a symlink: written to {written})"
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(item.output)
        sys.stdout.flush()
        shown_as = "<stdout>"
    locate = item.location if item.program.notebook is not None else None
    report_stream.write(format_report(item.result, item.path, shown_as, locate, todo_lines_in_original=args.diff)
                        + verify_report.getvalue())
    if args.verify and not args.in_place:  # streamed: the runs take a while
        status = max(status, _verify(item, args, script_args, options, written if args.output else None,
                                     report_stream))
    return status


def _main_many(files, found, args: argparse.Namespace) -> int:
    from apexlite.migrate.summary import format_summary
    from apexlite.migrate.writing import WriteError, write_atomically
    from apexlite.script_paths import output_path

    written: Dict[str, str] = {}
    if args.diff:
        for item in files:
            if item.changed:
                sys.stdout.writelines(_diff(item, item.path))
        how, stream = "diffs printed; nothing written", sys.stderr
    elif args.output or args.in_place:
        for item in files:
            if item.output is None or (args.in_place and not item.changed):
                continue
            destination = output_path(item.target, args.output, found) if args.output else item.path
            try:
                write_atomically(destination, item.output, make_folders=bool(args.output))
                written[item.path] = destination
            except WriteError as error:
                item.write_error = str(error)
        how = (f"written under {args.output}: the files read, migrated or not" if args.output
               else f"{counted(len(written), 'file')} rewritten in place")
        stream = sys.stdout
    else:
        how, stream = "nothing written: add --in-place, -o OUTDIR or --diff", sys.stdout
    stream.write(format_summary(files, found, written, how))
    statuses = [WRITE_FAILED_STATUS if item.write_error is not None else item.exit_status for item in files]
    return max(statuses, default=0)


def _decoded(source: bytes) -> str:
    """Text as Python reads the source (its coding line or BOM, else UTF-8)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    return source.decode(encoding, "replace")


def _diff(item, name: str) -> List[str]:
    """A unified diff of one file (a notebook: of its code cells, each under a `# In[cell N]` line)."""
    if item.program.notebook is not None:
        before, after = item.program.notebook.cells_text(item.program.data), item.program.notebook.cells_text(item.output)
        before, after = before.splitlines(True), after.splitlines(True)
    else:
        before = _decoded(item.program.data).splitlines(True)
        after = _decoded(item.output).splitlines(True)
    return list(difflib.unified_diff(before, after, fromfile=f"a/{name}", tofile=f"b/{name}"))
