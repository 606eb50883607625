"""A folder holding several programs is judged program by program (apexlite.migrate.programs): files are
grouped by what imports what, so two unrelated projects that each call amp.initialize once both migrate
completely, and a TODO about several amp.initialize calls names only those of the file's own programs."""
from pathlib import Path

import pytest

from apexlite.migrate import cli
from apexlite.migrate.engine import migrate_sources
from apexlite.migrate.programs import ImportGraph, ModuleIndex, read_facts

TRAIN = """import torch
from apex import amp
from trainer import train


def main():
    model = torch.nn.Linear(4, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    train(model, optimizer)
"""
TRAINER = """import torch
from apex import amp


def train(model, optimizer):
    for _ in range(3):
        loss = model(torch.randn(2, 4).cuda()).sum()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
"""
SHARED_USER = TRAIN.replace("from trainer import train", "from common.trainer import train")


def _tree(root: Path, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return {root / name: (root / name).read_bytes() for name in files}


def test_two_unrelated_programs_each_migrate_completely(tmp_path):
    sources = _tree(tmp_path, {"project_a/train.py": TRAIN, "project_a/trainer.py": TRAINER,
                               "project_b/train.py": TRAIN, "project_b/trainer.py": TRAINER})
    results = migrate_sources(sources)
    for key, result in results.items():
        assert result.exit_status == 0, (key, [todo.message for todo in result.todos])
        assert result.remaining == [] and b"from apex" not in result.migrated
    for project in ("project_a", "project_b"):
        assert b"train(model, optimizer, scaler=scaler)" in results[tmp_path / project / "train.py"].migrated
        assert b"def train(model, optimizer, *, scaler):" in results[tmp_path / project / "trainer.py"].migrated


def test_the_command_line_table_judges_each_program_on_its_own(tmp_path, capsys):
    _tree(tmp_path, {"project_a/train.py": TRAIN, "project_a/trainer.py": TRAINER,
                     "project_b/train.py": TRAIN, "project_b/trainer.py": TRAINER})
    assert cli.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "apexlite migrate: 4 files: 4 migrated"
    assert "more than once" not in out


def test_a_module_two_programs_share_names_only_their_calls(tmp_path):
    sources = _tree(tmp_path, {"one/train.py": SHARED_USER, "two/train.py": SHARED_USER,
                               "common/__init__.py": "", "common/trainer.py": TRAINER,
                               "other/train.py": TRAIN, "other/trainer.py": TRAINER})
    results = migrate_sources(sources)
    shared = results[tmp_path / "common" / "trainer.py"]
    assert shared.exit_status == 1
    message = shared.todos[0].message
    assert "amp.initialize is called more than once (one/train.py:9, two/train.py:9) in the programs" in message
    assert "other" not in message
    assert results[tmp_path / "other" / "train.py"].exit_status == 0  # the unrelated project is untouched by it
    assert results[tmp_path / "other" / "trainer.py"].exit_status == 0


def test_one_program_with_two_initialize_calls_is_still_named(tmp_path):
    main = "import first\nimport second\n"
    first = "from apex import amp\nmodel, optimizer = amp.initialize(model, optimizer)\n"
    sources = _tree(tmp_path, {"app/main.py": main, "app/first.py": first, "app/second.py": first,
                               "app/step.py": "from apex import amp\nimport first\nwith amp.scale_loss(l, o) as s:\n"
                                              "    s.backward()\n",
                               "solo/train.py": TRAIN, "solo/trainer.py": TRAINER})
    results = migrate_sources(sources)
    step = results[tmp_path / "app" / "step.py"]
    assert "more than once (app/first.py:2, app/second.py:2)" in step.todos[0].message
    assert results[tmp_path / "solo" / "trainer.py"].exit_status == 0


def test_a_program_reads_only_the_files_that_connect_its_amp_files(tmp_path, monkeypatch):
    from apexlite.migrate import engine

    parsed = []
    parse = engine.parse
    monkeypatch.setattr(engine, "parse", lambda source: parsed.append(source) or parse(source))
    helper = "def lr(step):\n    return 0.1\n"
    sources = _tree(tmp_path, {"project_a/train.py": TRAIN.replace("import torch\n", "import torch\nimport sched\n"),
                               "project_a/trainer.py": TRAINER, "project_a/sched.py": helper,
                               "project_a/far.py": "import sched\n", "project_b/plain.py": "import os\n"})
    migrate_sources(sources)
    read = [key.relative_to(tmp_path).as_posix() for key, source in sources.items() if source in parsed]
    assert sorted(read) == ["project_a/sched.py", "project_a/train.py", "project_a/trainer.py"]


@pytest.mark.parametrize("importer,module,level,expected", [
    ("a/train.py", "trainer", 0, "a/trainer.py"),  # the nearest root above the importer wins
    ("b/train.py", "trainer", 0, "b/trainer.py"),
    ("c/train.py", "trainer", 0, None),  # several fit and none is above it
    ("a/train.py", "pkg.mod", 0, "lib/pkg/mod.py"),
    ("lib/pkg/mod.py", "util", 1, "lib/pkg/util/__init__.py"),
    ("lib/pkg/util/__init__.py", "mod", 2, "lib/pkg/mod.py"),
])
def test_module_names_resolve_to_the_file_python_would_import(importer, module, level, expected):
    index = ModuleIndex(Path(name) for name in ["a/train.py", "a/trainer.py", "b/train.py", "b/trainer.py",
                                                 "c/train.py", "lib/pkg/mod.py", "lib/pkg/util/__init__.py"])
    found = index.resolve(Path(importer), module, level)
    assert found == (Path(expected) if expected else None)


def test_groups_cover_every_apex_file_once():
    files = {Path("a/train.py"): TRAIN, Path("a/trainer.py"): TRAINER, Path("b/train.py"): TRAIN,
             Path("b/trainer.py"): TRAINER, Path("b/unrelated.py"): "import os\n"}
    groups = ImportGraph({key: read_facts(text.encode()) for key, text in files.items()}).groups()
    assert sorted((sorted(map(str, group.keys)), str(group.home)) for group in groups) == [
        (["a/train.py", "a/trainer.py"], "a/train.py"), (["b/train.py", "b/trainer.py"], "b/train.py")]
