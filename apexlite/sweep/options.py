"""Command line of `python -m apexlite sweep`: every option documented, and checked before the first run."""
from __future__ import annotations

import argparse
import os
from typing import List, Optional, Tuple

from apexlite.amp.environment import DTYPE_NAMES
from apexlite.amp.opt_levels import OPT_LEVELS
from apexlite.amp.telemetry import DEFAULT_WARMUP_STEPS, MAX_STEPS_ENV
from apexlite.help_text import HelpFormatter
from apexlite.switches import help_section

PROG = "python -m apexlite sweep"
# accepted spelling -> canonical dtype name (the names APEXLITE_DTYPE accepts)
DTYPE_ALIASES = {name: str(dtype).replace("torch.", "") for name, dtype in DTYPE_NAMES.items()}
PLOT_FORMATS = (".png", ".pdf", ".svg")
TIE_MARGIN = 0.05  # a run must be at least this much faster (and measurably so) to be preferred
DEFAULT_BUDGET_S = 60.0
DEFAULT_PRECISION = 0.05

DESCRIPTION = """\
Run a training script once per (opt level, dtype), each in its own `python -m apexlite run` process, and
recommend one. The script stays unchanged: APEXLITE_OPT_LEVEL / APEXLITE_DTYPE override what it passes to
amp.initialize, and apexlite measures each run itself (steps, step time, tensor memory, losses seen by
amp.scale_loss, skipped steps, loss scale).

Speed is timed in rounds: every run starts and pauses after its warm-up; then, round after round, each
runs a short slice of steps while the others wait, so every pair is compared on the same machine moments
apart. Steps timed inside the run count; start-up and the first step after each pause do not, nor does a
step whose threads waited for a CPU (another process was running). Rounds go on until every speed ratio's
95% interval is within --precision of it, or --budget seconds are spent. A ratio is printed with its
interval (the median of the per-round ratios and a sign-test interval, which holds whatever the shape of
the noise); "no measurable difference" when the interval holds 1. When the timings say nothing (too few
rounds, most steps waited), the sweep says speed could not be measured and ranks by what was: status,
final loss, memory.

Statuses: ok; diverged (a non-finite loss after the first 3 steps, or a final loss above 2x the
baseline's); stalled (the baseline's loss fell at least 2% and this run's by under a quarter of that:
its updates may round away); failed (non-zero exit; the exception line is shown); timeout (killed with its child
processes; what it measured until then is kept). Any run that is not ok makes the exit status 1.

The recommendation is among the runs that are ok with a final loss at most --tolerance above the
baseline's (O0, or the first successful run when O0 is not swept): the lowest opt level (then the --dtypes
order) that no other run beat measurably (its whole interval above 1, the ratio at least 5% above 1)."""

EPILOG = f"""\
arguments after `--` go to the script unchanged:
  {PROG} train.py --max-steps 20 -- --epochs 90
  {PROG} train.py --opt-levels O0,O2 --dtypes fp16,bf16 --json runs.json

--max-steps sets {MAX_STEPS_ENV}=N in each run; the same variable works for a single run:
  {MAX_STEPS_ENV}=20 python -m apexlite run train.py

All runs are alive at once (paused while another runs): on a GPU they share its memory.

{help_section("sweep")}"""


def _whole_number(minimum: int):
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {value!r}")
        return number
    return parse


def _number(minimum: float, strict: bool):
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not (number > minimum if strict else number >= minimum) or number == float("inf"):
            bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {value!r}")
        return number
    return parse


def _opt_levels(value: str) -> List[str]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    bad = [item for item in items if item not in OPT_LEVELS]
    if bad or not items:
        raise argparse.ArgumentTypeError(
            f"{bad or value!r} not among {', '.join(OPT_LEVELS)} (letter O, not zero; comma-separated)")
    return list(dict.fromkeys(items))


def _dtypes(value: str) -> List[str]:
    items = [item.strip().lower() for item in value.split(",") if item.strip()]
    bad = [item for item in items if item not in DTYPE_ALIASES]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{bad or value!r} not among {', '.join(DTYPE_ALIASES)}")
    return list(dict.fromkeys(DTYPE_ALIASES[item] for item in items))


def _output_path(suffixes: Optional[Tuple[str, ...]]):
    def parse(value: str) -> str:
        directory = os.path.dirname(os.path.abspath(value))
        if os.path.isdir(value):
            raise argparse.ArgumentTypeError(f"{value!r} is a directory; give a file name")
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
            raise argparse.ArgumentTypeError(f"{value!r}: directory {directory!r} does not exist or is not "
                                             "writable")
        if suffixes and os.path.splitext(value)[1].lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"{value!r} must end in one of {', '.join(suffixes)}")
        return value
    return parse


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, usage="%(prog)s SCRIPT [options] [-- SCRIPT_ARGS ...]",
                                     description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=HelpFormatter)
    parser.add_argument("script", help="the training script (run unchanged, as `python -m apexlite run SCRIPT`)")
    parser.add_argument("--opt-levels", default=list(OPT_LEVELS), type=_opt_levels, metavar="LIST",
                        help="comma-separated opt levels from O0,O1,O2,O3 (default: O0,O1,O2,O3); O0 is the "
                             "fp32 baseline and runs once, as float32")
    parser.add_argument("--dtypes", default=["float16"], type=_dtypes, metavar="LIST",
                        help="comma-separated low-precision dtypes for O1-O3: float16 (aliases fp16, half), "
                             "bfloat16 (alias bf16) (default: float16)")
    parser.add_argument("--max-steps", type=_whole_number(1), metavar="N",
                        help=f"end each run cleanly after N optimizer steps (skipped overflow steps count); "
                             f"integer >= 1; default: none, the script runs to its end. Sets {MAX_STEPS_ENV}")
    parser.add_argument("--warmup", type=_whole_number(0), default=DEFAULT_WARMUP_STEPS, metavar="K",
                        help=f"first K steps left out of the step-time statistics; integer >= 0 "
                             f"(default: {DEFAULT_WARMUP_STEPS})")
    parser.add_argument("--repeats", type=_whole_number(1), default=1, metavar="R",
                        help="start every combination R times (fresh processes each time), their rounds pooled; "
                             "integer >= 1 (default: 1)")
    parser.add_argument("--budget", type=_number(0.0, strict=True), default=DEFAULT_BUDGET_S, metavar="SECONDS",
                        help="time for the timing rounds, all repeats together; the runs then go on to their end "
                             f"(or --max-steps); number > 0 (default: {DEFAULT_BUDGET_S:g})")
    parser.add_argument("--precision", type=_number(0.0, strict=True), default=DEFAULT_PRECISION, metavar="F",
                        help="stop the rounds early once every speed ratio's 95%% interval lies within this "
                             f"fraction of it; number > 0 (default: {DEFAULT_PRECISION:g}, i.e. +-5%%)")
    parser.add_argument("--tolerance", type=_number(0.0, strict=False), default=0.05,
                        metavar="F", help="how far (a fraction) a final loss may lie above the baseline's for "
                                          "the run to be recommended; number >= 0 (default: 0.05, i.e. 5%%)")
    parser.add_argument("--timeout", type=_number(0.0, strict=True), default=600.0,
                        metavar="SECONDS", help="limit per run on the time it runs (time paused while the others "
                                                "run is not counted); number > 0 (default: 600)")
    parser.add_argument("--json", dest="json_path", type=_output_path(None), metavar="FILE",
                        help="also write the runs, environment and recommendation to FILE as strict JSON "
                             "(values that are not finite are null; the status says why)")
    parser.add_argument("--plot", dest="plot_path", type=_output_path(PLOT_FORMATS), metavar="FILE",
                        help=f"also draw every run's loss curve by optimizer step into FILE "
                             f"({', '.join(PLOT_FORMATS)}); needs matplotlib (pip install 'apexlite[plot]')")
    return parser


def parse_args(argv: List[str]) -> argparse.Namespace:
    """Parse and check everything; a bad option exits with status 2 before any run starts."""
    script_args: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    parser = _build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (arguments for the script go after `--`)")
    args.script_args = script_args
    if os.path.isdir(args.script) and not os.path.isfile(os.path.join(args.script, "__main__.py")):
        parser.error(f"{args.script} is a folder without a __main__.py: name the script to run")
    if not os.path.exists(args.script):
        parser.error(f"no such script: {args.script}")
    if args.max_steps is not None and args.max_steps <= args.warmup:
        parser.error(f"--max-steps {args.max_steps} leaves no timed step after --warmup {args.warmup}: "
                     "use --max-steps > --warmup")
    if args.plot_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'apexlite[plot]' (or pip install matplotlib)")
    return args


def combinations(opt_levels: List[str], dtypes: List[str]) -> List[Tuple[str, str]]:
    """Every (level, dtype) pair; O0 (pure fp32) only once, labelled float32."""
    pairs: List[Tuple[str, str]] = []
    for level in opt_levels:
        for dtype in (["float32"] if level == "O0" else dtypes):
            pairs.append((level, dtype))
    return pairs
