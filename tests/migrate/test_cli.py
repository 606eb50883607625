"""`python -m apexlite migrate`: where the result goes, the report, the exit statuses, and libcst staying
optional (run/check never import it; without it migrate says how to get it)."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden")
SCRIPT = GOLDEN / "o1_runtime_device.in.py"
EXPECTED = (GOLDEN / "o1_runtime_device.out.py").read_bytes()


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "apexlite", "migrate", *map(str, args)], capture_output=True,
                          cwd=cwd, timeout=120)


def test_stdout_gets_the_script_and_stderr_the_report():
    result = run_cli(SCRIPT)
    assert result.returncode == 0
    assert result.stdout == EXPECTED
    assert b"migrated completely (opt_level O1: torch.autocast(float16) + torch.amp.GradScaler)" in result.stderr
    assert b"check: no apex APIs used" in result.stderr


def test_output_file_and_report_on_stdout(tmp_path):
    out = tmp_path / "migrated.py"
    result = run_cli(SCRIPT, "-o", out)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == EXPECTED
    assert f"-> {out}: migrated completely".encode() in result.stdout


def test_in_place_keeps_the_files_mode(tmp_path):
    script = tmp_path / "train.py"
    script.write_bytes(SCRIPT.read_bytes())
    script.chmod(0o750)
    assert run_cli(script, "--in-place").returncode == 0
    assert script.read_bytes() == EXPECTED
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert [path.name for path in tmp_path.iterdir()] == ["train.py"]  # no temporary file left behind


def test_diff(tmp_path):
    result = run_cli(SCRIPT, "--diff")
    assert result.returncode == 0
    assert result.stdout.startswith(f"--- a/{SCRIPT}\n+++ b/{SCRIPT}\n".encode())
    assert b"-from apex import amp\n" in result.stdout and b"+scaler = torch.amp.GradScaler(amp_device_type)\n" in \
        result.stdout


def test_todos_are_listed_with_their_lines_and_exit_1(tmp_path):
    out = tmp_path / "out.py"
    result = run_cli(GOLDEN / "todo_dynamic_level.in.py", "-o", out)
    assert result.returncode == 1
    lines = out.read_text().splitlines()
    report = result.stdout.decode()
    todo = next(line for line in report.splitlines() if line.startswith("  TODO "))
    number = int(todo.split(":")[1])
    assert lines[number - 1].startswith("# TODO(apexlite migrate): opt_level is chosen at run time")
    assert "check: the migrated script still uses apex.amp (line" in report


def test_opt_level_option_resolves_a_run_time_level(tmp_path):
    result = run_cli(GOLDEN / "todo_dynamic_level.in.py", "--opt-level", "O1")
    assert result.returncode == 0, result.stderr
    assert b"# apexlite migrate: migrated for opt_level O1 (the script chose `args.opt_level` at run time)" in \
        result.stdout


def test_unchanged_file_in_place_is_not_rewritten(tmp_path):
    script = tmp_path / "plain.py"
    script.write_bytes((GOLDEN / "no_apex.in.py").read_bytes())
    before = script.stat().st_mtime_ns
    result = run_cli(script, "--in-place")
    assert result.returncode == 0
    assert b"nothing to migrate" in result.stdout
    assert script.stat().st_mtime_ns == before


@pytest.mark.parametrize("make,message", [
    (lambda tmp: tmp / "missing.py", b"no such file"),
    (lambda tmp: tmp, b"no Python scripts or notebooks (.py, .ipynb) under"),
    (lambda tmp: _write(tmp / "bad.py", b"def broken(:\n"), b"is not Python source"),
    (lambda tmp: _write(tmp / "nul.py", b"x = 1\x00\n"), b"is not Python source"),
])
def test_bad_input_exits_2(tmp_path, make, message):
    result = run_cli(make(tmp_path))
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == b""


def _write(path, data):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("args,message", [
    (["--loss-scale", "-3"], b"--loss-scale must be"),
    (["--opt-level", "01"], b"invalid choice"),
    (["--max-steps", "0", "--verify"], b"--max-steps must be >= 1"),
    (["--tolerance", "-1", "--verify"], b"--tolerance must be a finite number >= 0"),
    (["--tolerance", "nan", "--verify"], b"--tolerance must be a finite number >= 0"),
    (["--timeout", "0", "--verify"], b"--timeout must be a finite number of seconds > 0"),
    (["--timeout", "-1", "--verify"], b"--timeout must be a finite number of seconds > 0"),
    (["--timeout", "nan", "--verify"], b"--timeout must be a finite number of seconds > 0"),
    (["--", "--epochs", "1"], b"add --verify"),
    (["--max-steps", "5"], b"--max-steps only applies under --verify"),  # never a silent no-op
    (["--tolerance", "1", "--timeout", "5"], b"--tolerance, --timeout only apply under --verify"),
    (["-o", "x.py", "--diff"], b"not allowed with"),
])
def test_bad_options_exit_2(args, message):
    result = run_cli(SCRIPT, *args)
    assert result.returncode == 2
    assert message in result.stderr


BLOCK_LIBCST = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "libcst":
            raise ModuleNotFoundError("No module named 'libcst'", name=name)
sys.meta_path.insert(0, Refuse())
import apexlite.cli
status = apexlite.cli.main(sys.argv[1:])
assert "libcst" not in sys.modules
sys.exit(status)
"""


def without_libcst(*command):
    return subprocess.run([sys.executable, "-c", BLOCK_LIBCST, *command], capture_output=True, cwd=ROOT, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("APEXLITE_")})


@pytest.mark.parametrize("command", [["check", "examples/dcgan_amp.py"], ["run", "tests/migrate/golden/fp16_utils.in.py"],
                                     ["migrate", "--help"]])
def test_run_and_check_work_without_libcst(command):
    """`run` and `check` (and migrate's --help) never import libcst: they work where it is not installed."""
    result = without_libcst(*command)
    assert result.returncode == 0, result.stderr[-2000:]


def test_without_libcst_migrate_says_how_to_get_it():
    result = without_libcst("migrate", str(SCRIPT))
    assert result.returncode == 2
    assert result.stderr.endswith("apexlite migrate needs libcst: pip install 'apexlite[migrate]'\n")
    assert result.stdout == ""


def test_migrate_is_a_listed_command():
    result = subprocess.run([sys.executable, "-m", "apexlite", "--help"], capture_output=True, text=True, timeout=60)
    assert "migrate" in result.stdout and "apexlite[migrate]" in result.stdout


def test_options_for_run_time_choices_are_named_when_the_script_chose_literally():
    """--opt-level/--loss-scale apply only where the script picks the value at run time; given for a script that
    writes its own, the migration follows the script and the report says the option was not used."""
    result = run_cli(SCRIPT, "--opt-level", "O2", "--loss-scale", "128")
    assert result.returncode == 0, result.stderr
    assert result.stdout == EXPECTED
    report = result.stderr.decode()
    assert ("--opt-level O2 not used: the script's amp.initialize picks opt_level O1 itself, which is what was "
            "migrated (--opt-level is for a level chosen at run time)") in report
    assert ("--loss-scale 128 not used: the script's amp.initialize leaves loss_scale to O1's default, which is what "
            "was migrated (--loss-scale is for a scale chosen at run time)") in report
    same = run_cli(SCRIPT, "--opt-level", "O1")
    assert same.stdout == EXPECTED and b"not used" not in same.stderr
