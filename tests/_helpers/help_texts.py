"""Every `python -m apexlite ... --help` text, produced in this process (the terminal width comes from COLUMNS)."""
import contextlib
import io

import pytest


def _argparse_help(build_parser):
    return build_parser().format_help()


def _printed(main, argv):
    """What `main(argv)` writes to stdout (argparse's --help exits; the hand-written ones return 0)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit as stop:
            assert stop.code in (0, None)
    return out.getvalue()


def help_text(command):
    """The --help text of `command` ("" for `python -m apexlite --help` itself)."""
    if command == "":
        from apexlite import cli

        return _printed(cli.main, ["--help"])
    if command == "run":
        from apexlite import runner

        return _printed(runner.main, ["--help"])
    if command == "sweep":
        from apexlite.sweep import options

        return _argparse_help(options._build_parser)
    if command == "check":
        from apexlite import check

        return _argparse_help(check._parser)
    if command == "doctor":
        from apexlite import doctor

        return _printed(doctor.main, ["--help"])
    if command == "alias":
        from apexlite.compat import alias

        return _printed(alias.main, ["--help"])
    if command == "migrate":
        pytest.importorskip("libcst", reason="migrate needs libcst (apexlite[migrate])")
        from apexlite.migrate import cli

        return _argparse_help(cli._parser)
    raise ValueError(command)


COMMANDS = ("", "run", "sweep", "check", "doctor", "alias", "migrate")
