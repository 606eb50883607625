"""Every APEXLITE_ environment switch in one table, and which command does what with it: each command's
--help and the README's switch table are both written from here, so neither can leave one out.

Nothing here imports torch (run prints its help before the script imports anything). The modules that
read a switch keep their own constant for its name; tests/test_switches.py checks those constants, the
help texts and the README against this table, and that no APEXLITE_ name in the sources is missing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Tuple


@dataclass(frozen=True)
class Switch:
    """One variable: its name, the values it takes, what it does, and when it is read."""

    name: str
    value: str
    effect: str
    read_when: str  # "run time": by amp and the kernels in any process; "install": by setup.py / pip


SWITCHES: Tuple[Switch, ...] = (
    Switch("APEXLITE_OPT_LEVEL", "O0|O1|O2|O3", "overrides the opt level the script passes to amp.initialize "
           "(logged when it applies); the script's options that level refuses (keep_batchnorm_fp32 at O1, say) "
           "are left out, logged", "run time"),
    Switch("APEXLITE_DTYPE", "float16|bfloat16", "the low-precision dtype of every opt level, overriding the "
           "script's (logged when it applies); with bfloat16 the levels' default loss scale is 1.0, which skips no "
           "inf/NaN step (add APEXLITE_LOSS_SCALE=dynamic to keep the check)", "run time"),
    Switch("APEXLITE_LOSS_SCALE", "N|dynamic", "replaces the script's loss scale for every loss", "run time"),
    Switch("APEXLITE_MAX_STEPS", "N", "ends the script cleanly (exit status 0, one log line) after N step() calls "
           "of amp's optimizers, skipped overflow steps included", "run time"),
    Switch("APEXLITE_TELEMETRY", "FILE", "writes what apexlite measured (steps, step times, memory, losses, loss "
           "scale, skipped steps) to FILE as JSON, about once a second, at exit and on SIGTERM", "run time"),
    Switch("APEXLITE_WARMUP_STEPS", "K", "the first K steps are left out of the telemetry's step times "
           "(default 3)", "run time"),
    Switch("APEXLITE_DISABLE_EXTENSION", "1", "FusedAdam and O1 use no compiled code of apexlite (torch's fused "
           "Adam ops and the Python casts instead)", "run time"),
    Switch("APEXLITE_CUDA", "1", "the install also compiles the CUDA kernel", "install"),
    Switch("APEXLITE_BUILD_EXTENSION", "0", "the install compiles nothing", "install"),
    Switch("APEXLITE_REQUIRE_EXTENSION", "1", "a part the install meant to compile and did not fails the install "
           "(CI uses it)", "install"),
)
# set by apexlite for its own children, never by hand: name -> who sets it
INTERNAL = {"APEXLITE_SWEEP_GATE": "sweep, to pace the runs it starts (apexlite.sweep.gate)",
            "APEXLITE_LAYER_DTYPES": "migrate --verify, to count the dtypes layers return (apexlite.amp.layer_precision)"}

HONOURS = "honours"  # the command, or the script it runs, reads the switch from your environment
SETS = "sets"  # the command sets it for each run it starts, replacing yours
PASSES = "passes on"  # the command leaves it to each run it starts
RUN_TIME = tuple(switch.name for switch in SWITCHES if switch.read_when == "run time")

# command -> switch name -> what the command does with it
COMMANDS: Dict[str, Dict[str, str]] = {
    "run": dict.fromkeys(RUN_TIME, HONOURS),
    "sweep": {**dict.fromkeys(("APEXLITE_OPT_LEVEL", "APEXLITE_DTYPE", "APEXLITE_MAX_STEPS", "APEXLITE_TELEMETRY",
                                "APEXLITE_WARMUP_STEPS"), SETS),
              **dict.fromkeys(("APEXLITE_LOSS_SCALE", "APEXLITE_DISABLE_EXTENSION"), PASSES)},
    "migrate": {**dict.fromkeys(("APEXLITE_OPT_LEVEL", "APEXLITE_DTYPE", "APEXLITE_MAX_STEPS", "APEXLITE_TELEMETRY",
                                  "APEXLITE_WARMUP_STEPS"), SETS),
                **dict.fromkeys(("APEXLITE_LOSS_SCALE", "APEXLITE_DISABLE_EXTENSION"), PASSES)},
    "doctor": {"APEXLITE_DISABLE_EXTENSION": HONOURS},
    "check": {},
    "alias": {},
}
ROLE_HEADINGS = {
    HONOURS: "environment switches it reads:",
    SETS: "environment switches it sets for each run it starts (yours are replaced):",
    PASSES: "environment switches it passes on to each run it starts:",
}
NOTES = {
    "migrate": "(--verify only; the migrated script runs with every APEXLITE_ variable removed)",
    "sweep": "(see `python -m apexlite run --help` for what each does)",
}


ON_OFF = tuple(switch.name for switch in SWITCHES if switch.value in ("0", "1"))  # read by build_plan.switch_on


def refused_values(environ: Mapping[str, str]) -> List[str]:
    """Why each on/off switch set in `environ` to neither on nor off is refused (checked before a command
    runs, so a typo stops it with the fix instead of quietly meaning off)."""
    from apexlite._native.build_plan import switch_on

    refused = []
    for name in ON_OFF:
        try:
            switch_on(name, environ=environ)
        except ValueError as error:
            refused.append(str(error))
    return refused


def switch_roles(command: str) -> Dict[str, str]:
    """What `command` does with each switch it uses (HONOURS, SETS or PASSES)."""
    return COMMANDS.get(command, {})


def by_name() -> Dict[str, Switch]:
    return {switch.name: switch for switch in SWITCHES}


def help_section(command: str) -> str:
    """The environment part of `command`'s --help: every switch it reads, sets or passes on."""
    roles = COMMANDS[command]
    if not roles:
        return f"environment: no APEXLITE_ switch changes what {command} does."
    switches = by_name()
    lines: List[str] = []
    for role, heading in ROLE_HEADINGS.items():
        names = [name for name in roles if roles[name] == role]
        if not names:
            continue
        width = max(len(f"{name}={switches[name].value}") for name in names)
        lines += ([""] if lines else []) + [heading]
        lines += [f"  {name + '=' + switches[name].value:{width}}  {switches[name].effect}" for name in names]
    if command in NOTES:
        lines.append(NOTES[command])
    return "\n".join(lines)


READ_WHERE = {"run time": "at run time, by apexlite in any process", "install": "by `pip install` / `setup.py`"}


def readme_table() -> str:
    """The README's table of switches (markdown; a `|` in a value is escaped so the cell stays one cell)."""
    rows = ["| switch | what it does | read | commands |", "|---|---|---|---|"]
    for switch in SWITCHES:
        roles = [f"`{command}` {table[switch.name]}" for command, table in COMMANDS.items() if switch.name in table]
        value = switch.value.replace("|", "\\|")
        rows.append(f"| `{switch.name}={value}` | {switch.effect} | {READ_WHERE[switch.read_when]} | "
                    f"{', '.join(roles) or '-'} |")
    return "\n".join(rows)
