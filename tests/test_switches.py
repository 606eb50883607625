"""apexlite.switches: the one table of APEXLITE_ switches agrees with the code that reads them, with every
command's --help, with the README, and with what sweep and migrate really do to their runs' environment."""
import re
from pathlib import Path

import pytest

from apexlite import switches
from apexlite.amp import environment, telemetry
from apexlite.sweep import gate, process
from apexlite.switches import COMMANDS, HONOURS, INTERNAL, PASSES, ROLE_HEADINGS, SETS, SWITCHES
from tests._helpers.help_texts import help_text

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\bAPEXLITE_[A-Z][A-Z_]*[A-Z]\b")
TABLE = {switch.name for switch in SWITCHES}


def test_every_switch_the_sources_name_is_in_the_table():
    sources = [*(ROOT / "apexlite").rglob("*.py"), ROOT / "setup.py"]
    named = {name for path in sources for name in NAME.findall(path.read_text())}
    assert named - TABLE - set(INTERNAL) == set()
    assert TABLE <= named  # and nothing in the table that no code reads


def test_the_modules_that_read_a_switch_spell_it_as_the_table_does():
    """amp's run-time switches by their constants (the build switches are checked by the source scan above)."""
    constants = {environment.OPT_LEVEL_ENV, environment.DTYPE_ENV, environment.LOSS_SCALE_ENV,
                 telemetry.MAX_STEPS_ENV, telemetry.TELEMETRY_ENV, telemetry.WARMUP_ENV}
    assert constants == set(switches.RUN_TIME) - {"APEXLITE_DISABLE_EXTENSION"} and gate.GATE_ENV in INTERNAL


def test_the_readme_table_is_written_from_the_table():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- switches:begin -->\n", 1)[1].split("\n<!-- switches:end -->", 1)[0]
    assert block == switches.readme_table(), (
        "README.md's switch table is stale: replace the block with the output of "
        "python -c 'from apexlite import switches; print(switches.readme_table())'")
    assert "APEXLITE_TELEMETRY" in block


def _listed(text):
    """role -> switch names listed under that role's heading in a --help text."""
    listed, role = {}, None
    for line in text.splitlines():
        role = next((r for r, heading in ROLE_HEADINGS.items() if line == heading), role if line.startswith(" ")
                    else None)
        match = re.match(r"  (APEXLITE_[A-Z_]+)=", line)
        if role and match:
            listed.setdefault(role, []).append(match.group(1))
    return listed


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_help_lists_every_switch_the_command_reads_sets_or_passes_on(monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "200")
    text = help_text(command)
    expected = {role: [name for name, got in COMMANDS[command].items() if got == role]
                for role in (HONOURS, SETS, PASSES)}
    assert _listed(text) == {role: names for role, names in expected.items() if names}
    if not COMMANDS[command]:
        assert f"environment: no APEXLITE_ switch changes what {command} does." in text


def test_run_help_names_the_loss_scale_and_telemetry_switches(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    lines = {line.split()[0]: " ".join(line.split()[1:]) for line in help_text("run").splitlines()
             if line.startswith("  APEXLITE_")}
    assert lines["APEXLITE_LOSS_SCALE=N|dynamic"] == "replaces the script's loss scale for every loss"
    assert lines["APEXLITE_TELEMETRY=FILE"].startswith("writes what apexlite measured")


def test_the_top_level_help_names_every_switch(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    text = " ".join(help_text("").split())
    assert all(name in text for name in TABLE)


@pytest.mark.parametrize("command", ["sweep", "migrate"])
def test_what_sweep_and_migrate_do_to_their_runs_environment_is_what_the_table_says(monkeypatch, command):
    """Both start runs through process.sweep_environment: SETS replaced (or removed), PASSES kept."""
    mine = {name: f"users-{name}" for name in switches.RUN_TIME}
    for name, value in mine.items():
        monkeypatch.setenv(name, value)
    env = process.sweep_environment("O2", "float32", "/tmp/t.json", max_steps=None, warmup=3)
    for name, role in COMMANDS[command].items():
        if role == PASSES:
            assert env[name] == mine[name], name
        else:
            assert env.get(name) != mine[name], name
