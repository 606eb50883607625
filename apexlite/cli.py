"""`python -m apexlite COMMAND ...`: one entry point, one module per sub-command."""
from __future__ import annotations

import importlib
import os
import sys
from typing import List, Optional

# sub-command -> (module, one-line help). Each module defines `main(argv: list[str]) -> int`.
COMMANDS = {
    "run": ("apexlite.runner", "run a legacy apex script unchanged (apex imports resolve to apexlite)"),
    "sweep": ("apexlite.sweep", "run a script once per opt level / dtype and compare the runs"),
    "check": ("apexlite.check", "list the apex APIs a script uses and their status in apexlite"),
    "doctor": ("apexlite.doctor", "what is compiled, what runs, and why (`doctor --build` compiles the kernels)"),
    "alias": ("apexlite.compat.alias", "install|uninstall|status: make this environment's `apex` apexlite"),
    "migrate": ("apexlite.migrate.cli",
                "rewrite a legacy apex.amp script into native torch.amp (needs apexlite[migrate])"),
}
WAYS_IN = ("`import apex` resolves to apexlite: for one script with `run`, for the whole environment with "
           "`alias install`, or from inside a process (a notebook's first cell, a script a launcher starts) "
           "with `import apexlite; apexlite.install()`.")


def _usage() -> str:
    from apexlite.help_text import wrap
    from apexlite.switches import INTERNAL, SWITCHES

    lines = ["usage: python -m apexlite COMMAND [ARGS...] | --version", "", "commands:"]
    lines += [f"  {name:8} {help_}" for name, (_, help_) in COMMANDS.items()]
    names = ", ".join(switch.name for switch in SWITCHES if switch.name not in INTERNAL)
    switches = f"environment switches: {names} (`COMMAND --help` lists those each command reads)"
    return wrap("\n".join(lines + ["", WAYS_IN, "", switches]))


def main(argv: Optional[List[str]] = None) -> int:
    """Dispatch to the sub-command module; unknown commands get the usage text and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(_usage() + "\n")
        return 0 if argv else 2
    if argv[0] == "--version":
        from apexlite.doctor import version_text

        sys.stdout.write(version_text())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        sys.stderr.write(f"apexlite: unknown command {command!r}\n{_usage()}\n")
        return 2
    from apexlite.switch_values import refused_values as refused_settings
    from apexlite.switches import HONOURS, PASSES, refused_values, switch_roles

    refused = refused_values(os.environ)
    refused += refused_settings(name for name, role in switch_roles(command).items() if role in (HONOURS, PASSES))
    if refused:
        sys.stderr.write("".join(f"apexlite {command}: {reason}\n" for reason in refused))
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)
