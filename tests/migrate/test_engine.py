"""The engine: a rewrite that would read names it does not define is refused (the rewrite and the import pass
each checked: apexlite.migrate.rewrite_check); the shortcut for sources that never name apex; the cycle
collector left as it was found."""
from pathlib import Path

import pytest

from apexlite.migrate import engine
from apexlite.migrate.engine import migrate_source


def test_a_source_that_never_names_apex_is_returned_without_a_rewrite():
    source = b"import torch\nloss = torch.nn.functional.binary_cross_entropy(p, t)\n"
    result = migrate_source(source)
    assert result.migrated is source and not result.todos and result.error is None
    assert [api for api, _, _ in result.remaining] == ["torch.nn.functional.binary_cross_entropy"]  # check still reads it


def test_a_rewrite_that_would_read_an_undefined_name_is_refused(monkeypatch):
    """A planner bug that drops a definition still in use: the original is kept and the report says why."""
    import libcst as cst

    planned = engine._plan

    def dropping_the_definition(*args, **kwargs):
        plans, setup = planned(*args, **kwargs)
        (plan,) = plans.values()
        analysis = plan.analysis
        assign = next(node for node in analysis.nodes(cst.Assign) if analysis.code(node).startswith("width"))
        plan.replace_small(assign, lambda updated: [])
        return plans, setup

    monkeypatch.setattr(engine, "_plan", dropping_the_definition)
    source = b"from apex import amp\nwidth = 4\nprint(width, amp)\n"
    result = migrate_source(source)
    assert result.migrated == source and result.exit_status == 1
    assert result.error == ("the rewritten script is not sound (it would read width without defining it (a migrate "
                            "bug: please report it)); nothing changed")


def test_an_import_pass_that_drops_an_import_still_in_use_is_refused(monkeypatch):
    from apexlite.migrate.imports import ImportPlanner

    monkeypatch.setattr(ImportPlanner, "_used", lambda self, node, alias: False)
    source = b"from apex import amp\nimport torch\nprint(amp.some_unknown_api)\n"  # a TODO keeps amp in use
    result = migrate_source(source)
    assert result.migrated == source
    assert "it would read amp without defining it" in result.error


def test_a_rewrite_reading_a_name_before_its_definition_is_refused(monkeypatch):
    """Order matters to the rewrite's check (the flow check): a use moved above its definition is caught."""
    import libcst as cst

    planned = engine._plan

    def moving_a_use_up(*args, **kwargs):
        plans, setup = planned(*args, **kwargs)
        (plan,) = plans.values()
        analysis = plan.analysis
        first = next(node for node in analysis.nodes(cst.Expr) if analysis.code(node).startswith("print(1)"))
        plan.replace_small(first, lambda updated: [cst.parse_statement("print(width)").body[0]])
        return plans, setup

    monkeypatch.setattr(engine, "_plan", moving_a_use_up)
    source = b"from apex import amp\nprint(1)\nwidth = 4\nprint(width, amp)\n"
    result = migrate_source(source)
    assert "it would read width where some path leaves it undefined" in result.error
    assert result.migrated == source


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cycle_collector_is_left_as_it_was_found(enabled):
    import gc

    source = (Path(__file__).with_name("golden") / "o1_cuda.in.py").read_bytes()
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        migrate_source(source)
        assert gc.isenabled() is enabled
        with pytest.raises(Exception):
            migrate_source(b"from apex import amp\ndef f(:\n")  # libcst refuses it inside the pause
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
