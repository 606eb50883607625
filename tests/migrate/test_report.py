"""What migrate's report says: places left counted in words that fit the number, one parenthetical, the
flags a second run needs, and the user's own file named under --diff (with the script's own lines)."""
import re
import subprocess
import sys
from pathlib import Path

from apexlite.migrate.engine import migrate_source
from apexlite.migrate.report import format_report

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden")


def _report(name, shown_as="out.py", **kwargs):
    result = migrate_source((GOLDEN / f"{name}.in.py").read_bytes())
    return result, format_report(result, f"{name}.py", shown_as, **kwargs).splitlines()


def test_one_place_is_singular_and_the_head_has_one_parenthetical():
    _, lines = _report("todo_dynamic_level")
    assert lines[0] == "apexlite migrate: todo_dynamic_level.py -> out.py: 1 place left for you (marked " \
                       "TODO(apexlite migrate))"


def test_every_blocker_and_the_flags_of_a_second_run_in_one_report():
    result, lines = _report("todo_blockers")
    assert lines[0].endswith(": 3 places left for you (marked TODO(apexlite migrate))")
    assert [line.split(": ", 1)[0] for line in lines[1:4]] == ["  TODO out.py:22", "  TODO out.py:25",
                                                               "  TODO out.py:42"]
    assert result.flags == ["--opt-level O1", "--loss-scale dynamic"]
    assert "  run migrate again with --opt-level O1 --loss-scale dynamic (or the values you train with) for the " \
           "choices the script makes at run time" in lines


def test_diff_reports_name_the_script_and_its_own_lines():
    result, lines = _report("todo_blockers", shown_as="todo_blockers.py", todo_lines_in_original=True)
    assert lines[0].startswith("apexlite migrate: todo_blockers.py: 3 places left")
    assert [todo.line for todo in result.todos] == [22, 22, 36]
    assert lines[1].startswith("  TODO todo_blockers.py:22: opt_level")
    assert lines[3].startswith("  TODO todo_blockers.py:36: this scale_loss")


def test_diff_summary_on_the_command_line_names_the_users_file():
    script = GOLDEN / "todo_dynamic_level.in.py"
    result = subprocess.run([sys.executable, "-m", "apexlite", "migrate", str(script), "--diff"], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 1
    assert f"apexlite migrate: {script}: 1 place left for you" in result.stderr
    assert f"  TODO {script}:11: opt_level is chosen at run time" in result.stderr
    assert f"b/{script}" not in result.stderr


def test_o2_kept_on_apexlite_is_its_own_outcome_with_the_reason():
    result, lines = _report("o2_keep")
    assert result.exit_status == 0 and result.needs_apexlite and not result.todos
    assert lines[0] == ("apexlite migrate: o2_keep.py -> out.py: kept on apexlite, not migrated to native torch.amp "
                        "(opt_level O2: amp kept from apexlite)")
    assert lines[1].startswith("  why: amp stays, imported from apexlite, which the script now needs installed: "
                               "O2's fp32 master weights have no torch.amp recipe")
    assert not any("migrated completely" in line for line in lines)


def test_a_native_migration_is_never_reported_as_kept():
    result, lines = _report("o1_cuda")
    assert not result.needs_apexlite and "migrated completely" in lines[0] and "apexlite" not in lines[0][30:]


def test_a_folder_counts_kept_files_apart_from_migrated_ones(tmp_path, capsys):
    from apexlite.migrate import cli

    for name, case in [("a_kept.py", "o2_keep"), ("b_native.py", "o1_cuda")]:
        (tmp_path / name).write_bytes((GOLDEN / f"{case}.in.py").read_bytes())
    assert cli.main([str(tmp_path)]) == 0  # both complete: README's exit status 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "apexlite migrate: 2 files: 1 migrated, 1 kept on apexlite"
    assert re.fullmatch(rf"  {tmp_path / 'a_kept.py'}\s+kept on apexlite\s+0\s+opt_level O2: amp kept from apexlite",
                        out[2])
    assert re.fullmatch(rf"  {tmp_path / 'b_native.py'}\s+migrated\s+0\s+opt_level O1: torch.autocast.+", out[3])
    assert f"  kept on apexlite ({tmp_path / 'a_kept.py'}): amp stays, imported from apexlite" in "\n".join(out)
