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


@pytest.mark.parametrize("command", ["run", "doctor", "sweep", "migrate"])
def test_an_on_off_switch_with_another_value_stops_every_command(capsys, monkeypatch, command):
    """APEXLITE_DISABLE_EXTENSION=banana used to mean off, quietly; now the command stops with the fix."""
    monkeypatch.setenv("APEXLITE_DISABLE_EXTENSION", "banana")
    assert cli.main([command, "--help"]) == 2
    err = capsys.readouterr().err
    assert err == (f"apexlite {command}: APEXLITE_DISABLE_EXTENSION='banana' is neither on nor off: set it to 1 to "
                   "turn it on, or to 0 (or unset it) to turn it off\n")


@pytest.mark.parametrize("value", ["1", "0", "off", ""])
def test_on_off_values_pass(capsys, monkeypatch, value):
    monkeypatch.setenv("APEXLITE_DISABLE_EXTENSION", value)
    assert cli.main(["run", "--help"]) == 0
