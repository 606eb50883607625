"""`python -m apexlite COMMAND`: the dispatcher lists every command and the ways in, and routes `alias`."""
import pytest

from apexlite import cli


def test_usage_lists_every_command_and_the_ways_in(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("run", "sweep", "check", "doctor", "alias"):
        assert f"\n  {command} " in out
    assert "apexlite.install()" in out and "alias install" in out


@pytest.mark.parametrize("argv,status", [([], 2), (["nonsense"], 2), (["alias"], 2), (["alias", "bogus"], 2)])
def test_bad_invocations_exit_2_with_usage(capsys, argv, status):
    assert cli.main(argv) == status
    captured = capsys.readouterr()
    assert "usage: python -m apexlite" in captured.out + captured.err


def test_alias_status_is_dispatched(capsys):
    status = cli.main(["alias", "status"])
    captured = capsys.readouterr()
    assert status in (0, 1) and "apexlite alias" in captured.out + captured.err
