"""Every `# apexlite migrate: ...` note describes a rewrite migrate made: each is read back against the
migrated code.

A note says what became of amp.initialize (torch.autocast around the forward pass with a given dtype,
GradScalers by name, a model cast, plain fp32, O2 kept on apexlite), what a flag enables, what was
dropped, which function now takes the GradScaler, what checkpoint loading does. CLAIMS turns each kind of
note into a check of the code (its syntax tree: the `with torch.autocast(...)` blocks and their dtype,
each named GradScaler made and used for scale/step/update, the parameter added and read, every call
passing it); a note no check knows fails, so a new kind of note needs its check. Inputs: every golden
case, the examples under every opt level, the files migrated together in scripts/, and the fixtures of
the timm and reid shapes.
"""
import ast
import csv
import re
import shlex
from pathlib import Path
from typing import Dict, List

import pytest

from apexlite.migrate.cli import migrate_options, parse_arguments
from apexlite.migrate.edits import NOTE_PREFIX
from apexlite.migrate.engine import migrate_sources
from tests.migrate.test_custom_casts import header_lists

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
GOLDEN = HERE / "golden"
SCRIPTS = HERE / "scripts"
EXAMPLE_OPTIONS = ["--opt-level O1 --loss-scale dynamic", "--opt-level O1 --loss-scale 128", "--opt-level O0",
                   "--opt-level O2", "--opt-level O2 --o2=bf16-autocast", "--opt-level O3 --loss-scale 1.0"]


class Program:
    """The migrated files of one run, parsed; notes are read file by file, claims checked on all of them."""

    def __init__(self, outputs: Dict[str, bytes]) -> None:
        self.outputs = outputs
        self.trees = {name: ast.parse(code) for name, code in outputs.items()}
        self.nodes = [node for tree in self.trees.values() for node in ast.walk(tree)]

    def calls(self, dotted: str) -> List[ast.Call]:
        return [node for node in self.nodes if isinstance(node, ast.Call) and _dotted(node.func) == dotted]

    def autocasts(self) -> List[ast.With]:
        return [node for node in self.nodes if isinstance(node, ast.With) and any(
            isinstance(item.context_expr, ast.Call) and _dotted(item.context_expr.func) == "torch.autocast"
            for item in node.items)]

    def grad_scalers(self) -> Dict[str, ast.Call]:
        return {_dotted(target): node.value for node in self.nodes if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call) and _dotted(node.value.func) == "torch.amp.GradScaler"
                for target in node.targets if isinstance(target, (ast.Name, ast.Attribute))}  # `self.scaler = ...`

    def method_calls(self, owner: str, method: str) -> List[ast.Call]:
        return self.calls(f"{owner}.{method}")


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _keyword(call: ast.Call, name: str):
    return next((keyword.value for keyword in call.keywords if keyword.arg == name), None)


def _statement_below(program: Program, name: str, line: int) -> ast.stmt:
    """The statement that starts on the first code line after the note ending at `line`."""
    lines = program.outputs[name].decode("utf-8", "replace").splitlines()
    number = next(n for n in range(line + 1, len(lines) + 1) if lines[n - 1].strip()
                  and not lines[n - 1].strip().startswith("#"))
    return next(node for node in ast.walk(program.trees[name]) if isinstance(node, ast.stmt) and node.lineno == number)


# --- the claims ---------------------------------------------------------------------------------------
def _check_scalers(program: Program, names: str, flagged: bool) -> None:
    made = program.grad_scalers()
    for scaler in names.split(", "):
        assert scaler in made, f"no `{scaler} = torch.amp.GradScaler(...)`"
        assert program.method_calls(scaler, "scale") and program.method_calls(scaler, "step") \
            and program.method_calls(scaler, "update"), f"{scaler} is not used to scale, step and update"
        assert (_keyword(made[scaler], "enabled") is not None) == flagged


def _initialize(program: Program, note: str, name: str, line: int, match) -> None:
    assert not program.calls("amp.initialize"), "amp.initialize is still called"
    what, flagged = match["what"], bool(match["flagged"])
    scalers = re.fullmatch(r"(?P<core>.+?)(?: and torch\.amp\.GradScaler \((?P<names>.+)\))?", what)
    core = scalers["core"]
    autocasts = [block for block in program.autocasts()  # amp.disable_casts() became autocast(enabled=False)
                 if ast.unparse(_keyword(block.items[0].context_expr, "enabled") or ast.Constant(True)) != "False"]
    if core.startswith("torch.autocast("):
        dtype = re.fullmatch(r"torch\.autocast\((\w+)\) around the forward pass and the loss", core)[1]
        assert autocasts, "no `with torch.autocast(...)` block"
        for block in autocasts:
            call = block.items[0].context_expr
            assert _dotted(_keyword(call, "dtype")) == f"torch.{dtype}"
            assert (_keyword(call, "enabled") is not None) == flagged
            assert any(isinstance(node, ast.Call) for statement in block.body for node in ast.walk(statement))
    elif core.startswith("the model cast to "):
        dtype = re.fullmatch(r"the model cast to (\w+) \(pure low-precision training\)", core)[1]
        cast = ".half" if dtype == "float16" else ".to"
        assert any(_dotted(node.func).endswith(cast) for node in program.nodes if isinstance(node, ast.Call))
        assert not autocasts
    else:
        assert core == "plain fp32 training", core
        assert not autocasts and not any(_dotted(node.func).endswith(".half") for node in program.nodes
                                         if isinstance(node, ast.Call))
    if scalers["names"]:
        _check_scalers(program, scalers["names"], flagged)
    else:
        assert not program.grad_scalers(), "a GradScaler the note does not name"


def _static_scale(program: Program, note: str, name: str, line: int, match) -> None:
    scale = float(match[1])
    made = [call for call in program.grad_scalers().values()
            if isinstance(_keyword(call, "init_scale"), ast.Constant) and _keyword(call, "init_scale").value == scale]
    assert made and all(ast.unparse(_keyword(call, "growth_interval")) == "2 ** 31 - 1" for call in made)


def _o3_traps(program: Program, note: str, name: str, line: int, match) -> None:
    assert program.calls("model.half") or any(_dotted(node.func).endswith((".half", ".to")) for node in program.nodes
                                              if isinstance(node, ast.Call))
    assert any(_dotted(node.func).endswith(".register_forward_pre_hook") for node in program.nodes
               if isinstance(node, ast.Call))
    assert any(_dotted(node.func).endswith(".register_forward_hook") for node in program.nodes  # output to fp32
               if isinstance(node, ast.Call))


def _amp_kept(program: Program, note: str, name: str, line: int, match) -> None:
    assert any(isinstance(node, ast.ImportFrom) and node.module == "apexlite" and any(
        alias.name == "amp" for alias in node.names) for node in program.nodes)
    assert program.calls("amp.initialize")


def _o2_bf16(program: Program, note: str, name: str, line: int, match) -> None:
    assert any(_dotted(_keyword(block.items[0].context_expr, "dtype")) == "torch.bfloat16"
               for block in program.autocasts())
    assert not program.grad_scalers()


def _chosen_level(program: Program, note: str, name: str, line: int, match) -> None:
    text = program.outputs[name].decode("utf-8", "replace")
    assert f"amp.initialize (opt_level {match[1]})" in text.replace("\n#     ", " ")


def _chosen_scale(program: Program, note: str, name: str, line: int, match) -> None:
    scales = [_keyword(call, "init_scale") for call in program.grad_scalers().values()]
    assert scales, "no GradScaler"
    if match[1] == "dynamic":
        assert all(scale is None for scale in scales)
    else:
        assert all(isinstance(scale, ast.Constant) and scale.value == float(match[1]) for scale in scales)


def _dropped(program: Program, note: str, name: str, line: int, match) -> None:
    below = _statement_below(program, name, line)
    assert not any(keyword.arg == match[1] for node in ast.walk(below) if isinstance(node, ast.Call)
                   for keyword in node.keywords), ast.unparse(below)


def _forward_in_fp32(program: Program, note: str, name: str, line: int, match) -> None:
    """The statement below calls the model, under no torch.autocast."""
    below = _statement_below(program, name, line)
    assert any(isinstance(node, ast.Call) and _dotted(node.func) == match[1] for node in ast.walk(below))
    assert not any(below in ast.walk(block) for block in program.autocasts()), ast.unparse(below)


def _takes(program: Program, note: str, name: str, line: int, match) -> None:
    function, names = match[1], re.findall(r"`(\w+)=`", match[3])
    assert names and len(names) == (2 if " and the device type" in match[2] else 1)
    below = _statement_below(program, name, line)
    assert isinstance(below, ast.FunctionDef) and below.name == function
    assert [arg.arg for arg in below.args.kwonlyargs][-len(names):] == names
    read = {node.id for node in ast.walk(below) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    assert set(names) <= read, f"{function}() takes {names} but reads only {sorted(set(names) & read)}"
    # migrate threads the GradScaler through module-level functions called by name (imported by name elsewhere)
    calls = [node for node in program.nodes if isinstance(node, ast.Call) and _dotted(node.func) == function]
    assert calls and all({keyword.arg for keyword in call.keywords} >= set(names) for call in calls)


def _load_removed(program: Program, note: str, name: str, line: int, match) -> None:
    assert not program.calls("amp.load_state_dict") and not program.grad_scalers()


def _checkpoint(program: Program, note: str, name: str, line: int, match) -> None:
    below = _statement_below(program, name, line)
    scalers = program.grad_scalers()
    assert any(isinstance(node, ast.Call) and _dotted(node.func).endswith(".load_state_dict")
               and _dotted(node.func).rsplit(".", 1)[0] in scalers for node in ast.walk(below)), ast.unparse(below)


def _early_step(program: Program, note: str, name: str, line: int, match) -> None:
    """The statement below is the plain step; the optimizer's later steps go through the named GradScaler."""
    below = _statement_below(program, name, line)
    assert isinstance(below, ast.Expr) and _dotted(below.value.func) == f"{match[1]}.step" and not below.value.args
    later = [call for call in program.calls(f"{match[2]}.step") if call.args and _dotted(call.args[0]) == match[1]]
    assert later and all(call.lineno > below.lineno for call in later)


def _registration_removed(program: Program, note: str, name: str, line: int, match) -> None:
    """The registration is gone, and the op is on the list of torch.autocast's CUDA ops the note names, as read
    from the installed torch's header (tests/migrate/test_custom_casts.py reads it)."""
    assert not program.calls(f"amp.{match[1]}")
    lists = header_lists()
    if lists is not None:
        wanted = "lower" if match[3].startswith("in its lower precision") else "float32"
        assert match[2].rsplit(".", 1)[-1] in lists[wanted], note


CLAIMS = [
    (r"amp\.initialize \(opt_level O[0-3]\) (?:ran only when `.+`: it became|became) (?P<what>.+?)"
     r"(?P<flagged>, on every path, enabled by that flag|, enabled when `.+` \(its enabled=\)"
     r"|, enabled when `.+` \(its opt_level is O[1-3] then, O0 otherwise\)"
     r"|, enabled when `.+` \((?:its enabled=, and )?O0 at run time is fp32\))?", _initialize),
    (r"apex's static loss_scale=([\d.e+]+): GradScaler has no static mode, so its growth is disabled; unlike apex, "
     r"an overflowing step is skipped and halves it", _static_scale),
    (r"O3 traps: .+", _o3_traps),
    (r"amp stays on apexlite: .+", _amp_kept),
    (r"O2 \(fp16 weights, fp32 master weights\) became bf16 autocast over the fp32 model .+", _o2_bf16),
    (r"migrated for opt_level (O[0-3]) \(the script chose `.+` at run time\)", _chosen_level),
    (r"migrated for loss_scale (\S+) \(the script chose `.+` at run time\)", _chosen_scale),
    (r"`(\w+)` dropped: .+", _dropped),
    (r"(\w+)\(\) takes (the GradScaler|the device type|the GradScaler and the device type) that replaced amp "
     r"\((.+)\); every call migrate saw passes (?:it|them)", _takes),
    (r"amp\.load_state_dict\(\.\.\.\) removed: nothing is loss-scaled any more", _load_removed),
    (r"`amp\.(register_half_function|register_float_function)\(.+\)` removed: torch\.autocast on CUDA already runs "
     r"([\w.]+) (in its lower precision \(float16, or bfloat16 where the script asks for it\)|in float32)",
     _registration_removed),
    (r"`([\w.]+)\(\.\.\.\)` here runs in float32 now \(apex's O[1-3] ran every forward in low precision\); for "
     r"that, run it under `with torch\.autocast\(.+\):`(?: \((?:`\w+`(?:, )?)+ (?:is|are) not defined here: pass "
     r"(?:it|them) in\))?", _forward_in_fp32),
    (r"checkpoints written before the migration hold apex's scaler state .+", _checkpoint),
    (r"`([\w.]+)\.step\(\)` runs before any scaled backward, so it stays a plain step \((\w+)\.step would "
     r"refuse it: nothing was scaled yet\)", _early_step),
]


def notes(code: bytes):
    """(note text with its continuation lines joined, line of its last line) for each note in `code`."""
    lines = code.decode("utf-8", "replace").splitlines()
    index = 0
    while index < len(lines):
        stripped = lines[index].strip()
        if stripped.startswith(NOTE_PREFIX):
            text = stripped[len(NOTE_PREFIX):]
            while index + 1 < len(lines) and lines[index + 1].strip().startswith("#     "):
                index += 1
                text += " " + lines[index].strip()[len("#     "):]
            yield text, index + 1
        index += 1


# --- the inputs ---------------------------------------------------------------------------------------
def _runs():
    with open(GOLDEN / "cases.tsv", newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            yield f"golden-{row['name']}", [GOLDEN / f"{row['name']}.in.py"], row["options"]
    for example in sorted((ROOT / "examples").glob("*.py")):
        for options in EXAMPLE_OPTIONS:
            yield f"{example.stem}{options.replace(' ', '')}", [example], options
    yield "two_files", sorted((SCRIPTS / "two_files").glob("*.py")), "--opt-level O1"
    yield "timm_shaped", sorted((SCRIPTS / "timm_shaped").glob("*.py")), ""
    for script in (SCRIPTS / "flag_guarded_train.py", SCRIPTS / "comments_around_amp.py"):
        yield script.stem, [script], "--opt-level O1"


RUNS = list(_runs())


def _migrated(paths, options) -> Program:
    args, _ = parse_arguments([str(paths[0]), *shlex.split(options)])
    results = migrate_sources({path: path.read_bytes() for path in paths}, migrate_options(args))
    return Program({str(path): result.migrated for path, result in results.items()})


@pytest.mark.parametrize("paths,options", [run[1:] for run in RUNS], ids=[run[0] for run in RUNS])
def test_every_note_describes_a_rewrite_migrate_made(paths, options):
    program = _migrated(paths, options)
    for name, code in program.outputs.items():
        for note, line in notes(code):
            checks = [(match, check) for pattern, check in CLAIMS for match in [re.fullmatch(pattern, note)] if match]
            assert checks, f"{name}:{line}: no check reads this note back: {note}"
            for match, check in checks:
                check(program, note, name, line, match)


def test_the_checks_catch_a_note_the_code_does_not_bear_out():
    """A summary claiming autocast and a GradScaler over code with neither (what migrate once wrote for
    timm's pattern) fails its check."""
    code = (b"# apexlite migrate: amp.initialize (opt_level O1) became torch.autocast(float16) around the forward\n"
            b"#     pass and the loss and torch.amp.GradScaler (scaler)\nloss_scaler = utils.ApexScaler()\n")
    program = Program({"train.py": code})
    (note, line), = notes(code)
    match = re.fullmatch(CLAIMS[0][0], note)
    with pytest.raises(AssertionError, match="no `with torch.autocast"):
        _initialize(program, note, "train.py", line, match)
