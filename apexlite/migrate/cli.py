"""`python -m apexlite migrate SCRIPT [-o OUT | --diff | --in-place] [--verify [--max-steps N]] [-- ARGS]`.

Imports libcst only after the options are read, so `--help` works without it and a missing extra is
one clear line (exit 2), not a traceback. The migrated script goes to stdout (the report then goes to stderr), to OUT,
or over SCRIPT; `--diff` prints a unified diff instead. Exit status: 0 migrated completely (and, with
--verify, trained like the original), 1 TODOs left / the rewrite did not compile / verify disagreed,
2 bad input (missing, a directory, not Python) or bad options.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import io
import os
import sys
import tempfile
import tokenize
from typing import List, TextIO, Tuple

from apexlite.script_source import ScriptSourceError, read_source_bytes

INSTALL_HINT = "apexlite migrate needs libcst: pip install 'apexlite[migrate]'"
EXIT_STATUSES = (
    (0, "the script was migrated completely (and --verify found it trains like the original)"),
    (1, "TODOs were left, the rewrite did not compile (the original is kept), or --verify disagreed"),
    (2, "bad input (missing, not a regular file, not Python) or bad options, or libcst is missing"),
)
DEFAULT_MAX_STEPS = 20
DEFAULT_TIMEOUT_S = 600.0


def _parser() -> argparse.ArgumentParser:
    from apexlite.migrate.options import DEFAULT_TOLERANCE, O2_CHOICES

    epilog = "exit status:\n" + "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_STATUSES)
    parser = argparse.ArgumentParser(
        prog="python -m apexlite migrate", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog,
        usage="python -m apexlite migrate SCRIPT [-o OUT | --diff | --in-place] [options] [--verify [--max-steps N]]"
              " [-- SCRIPT_ARGS...]",
        description="Rewrite a legacy apex.amp script into native torch.amp (torch.autocast + torch.amp.GradScaler) "
                    "and torch's optimizers/DDP/norms, keeping everything else byte for byte. Places it cannot "
                    "rewrite with certainty keep their code and get a `# TODO(apexlite migrate): ...` comment.")
    parser.add_argument("script")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="OUT", help="write the migrated script to OUT (default: stdout)")
    where.add_argument("--diff", action="store_true", help="print a unified diff instead of the script")
    where.add_argument("--in-place", action="store_true", help="overwrite SCRIPT with the migrated script")
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
    parser.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, metavar="N",
                        help=f"optimizer steps per verify run (default {DEFAULT_MAX_STEPS})")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"largest relative loss difference verify accepts (default {DEFAULT_TOLERANCE:g}; "
                             "see MIGRATION.md for how it was chosen)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per verify run")
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
    if args.tolerance < 0:
        parser.error(f"--tolerance must be >= 0, got {args.tolerance}")


def parse_arguments(argv: List[str]) -> Tuple[argparse.Namespace, List[str]]:
    """migrate's own options and the script's arguments (after `--`); exits 2 on bad options."""
    own, script_args = _split(list(argv))
    parser = _parser()
    args = parser.parse_args(own)
    _check_options(parser, args)
    if script_args and not args.verify:
        parser.error("arguments after `--` are for the script under --verify; add --verify")
    return args, script_args


def migrate_options(args: argparse.Namespace):
    """The MigrateOptions the parsed command line asks for."""
    from apexlite.migrate.options import MigrateOptions

    return MigrateOptions(opt_level=args.opt_level, loss_scale=args.loss_scale, o2=args.o2)


def _write_atomically(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".apexlite-migrate-", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        if os.path.exists(path):
            os.chmod(temporary, os.stat(path).st_mode & 0o7777)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _report(result, script: str, shown_as: str, out: TextIO, todo_lines_in_original: bool = False) -> None:
    from apexlite.migrate.report import format_report

    out.write(format_report(result, script, shown_as, todo_lines_in_original))


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite migrate`."""
    args, script_args = parse_arguments(argv)
    try:
        import libcst
    except ImportError:
        sys.stderr.write(INSTALL_HINT + "\n")
        return 2

    from apexlite.migrate.engine import migrate_source

    try:
        source = read_source_bytes(args.script)
        ast.parse(source, args.script)
    except ScriptSourceError as error:
        sys.stderr.write(f"apexlite migrate: {error}\n")
        return 2
    except (SyntaxError, ValueError) as error:
        sys.stderr.write(f"apexlite migrate: {args.script} is not Python source Python would run: {error}\n")
        return 2
    options = migrate_options(args)
    try:
        result = migrate_source(source, options)
    except libcst.ParserSyntaxError as error:
        sys.stderr.write(f"apexlite migrate: libcst cannot parse {args.script}: {error.message} "
                         f"(line {error.raw_line}); nothing written\n")
        return 2
    except RecursionError:
        sys.stderr.write(f"apexlite migrate: {args.script} is nested too deeply to rewrite; nothing written\n")
        return 2
    report_stream = sys.stdout if (args.output or args.in_place) else sys.stderr
    if args.diff:
        sys.stdout.writelines(_diff(result.original, result.migrated, args.script))
        shown_as = args.script
    elif args.output or args.in_place:
        shown_as = args.output or args.script
        if args.output or result.changed:
            _write_atomically(shown_as, result.migrated)
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(result.migrated)
        sys.stdout.flush()
        shown_as = "<stdout>"
    _report(result, args.script, shown_as, report_stream, todo_lines_in_original=args.diff)
    status = result.exit_status
    if args.verify:
        from apexlite.migrate.verify import verify_migration

        verified = verify_migration(args.script, result, script_args, args.max_steps, args.timeout, args.tolerance,
                                    options, migrated_path=args.output if args.output else None,
                                    out=report_stream)
        status = max(status, verified)
    return status


def _decoded(source: bytes) -> str:
    """Text as Python reads the source (its coding line or BOM, else UTF-8)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    return source.decode(encoding, "replace")


def _diff(original: bytes, migrated: bytes, script: str) -> List[str]:
    before = _decoded(original).splitlines(True)
    after = _decoded(migrated).splitlines(True)
    return list(difflib.unified_diff(before, after, fromfile=f"a/{script}", tofile=f"b/{script}"))

