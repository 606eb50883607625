"""apexlite.help_text: help wrapped to the terminal; and every command's --help fits the window it is shown in."""
import pytest

from apexlite.help_text import wrap
from tests._helpers.help_texts import COMMANDS, help_text


def test_prose_is_refilled_and_items_hang_under_their_text():
    text = ("A first paragraph that goes on and on\nand is continued on a second line.\n\n"
            "  install    write the stand-ins into the site folder of this environment\n"
            "             (refused when a real apex is here)\n"
            "  status     say what is there")
    assert wrap(text, 40).splitlines() == [
        "A first paragraph that goes on and on",
        "and is continued on a second line.",
        "",
        "  install    write the stand-ins into",
        "             the site folder of this",
        "             environment (refused when a",
        "             real apex is here)",
        "  status     say what is there",
    ]


def test_usage_lines_hang_after_the_prefix_and_words_are_never_broken():
    usage = "usage: python -m apexlite migrate PATH... [-o OUT | --diff | --in-place] [-- SCRIPT_ARGS...]"
    assert wrap(usage, 50).splitlines() == ["usage: python -m apexlite migrate PATH... [-o OUT",
                                            "       | --diff | --in-place] [-- SCRIPT_ARGS...]"]
    path = "/a/" + "very-long-folder-name/" * 4
    assert path in wrap(f"  install    into {path} here", 40).splitlines()[1]


def _fits(text, columns):
    """Lines within `columns`, except a single word longer than the window (a path) on its own line."""
    return [line for line in text.splitlines() if len(line) > columns and len(line.split()) > 1]


@pytest.mark.parametrize("columns", [60, 80, 120])
@pytest.mark.parametrize("command", COMMANDS, ids=[name or "apexlite" for name in COMMANDS])
def test_every_help_fits_the_terminal(monkeypatch, command, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    text = help_text(command)
    assert _fits(text, columns - 2) == []


@pytest.mark.parametrize("command", COMMANDS, ids=[name or "apexlite" for name in COMMANDS])
def test_a_wide_terminal_gets_wide_lines(monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "200")
    wide = help_text(command)
    monkeypatch.setenv("COLUMNS", "80")
    narrow = help_text(command)
    assert max(len(line) for line in wide.splitlines()) > 100
    assert len(wide.splitlines()) < len(narrow.splitlines())
    assert _fits(wide, 198) == []
