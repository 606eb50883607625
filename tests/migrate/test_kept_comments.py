"""Everything migrate does not rewrite stays byte for byte, comments included (apexlite.migrate.kept_comments).

scripts/comments_around_amp.py has the shape of Person_reID_baseline_pytorch's train_DDP.py: amp behind a
module-level `if fp16:` whose block holds commented-out code, commented-out code right after that block
(libcst gives it to the block), and comments on, inside and around every apex statement. Every line
outside the statements migrate rewrites must come out unchanged and in order; every full-line comment
inside them must come out unchanged too, and every comment that ended a rewritten line must still be there.
Over every golden case and example, no comment of the input is ever missing from the output.
"""
import csv
import io
import tokenize
from collections import Counter
from pathlib import Path

import pytest

from apexlite.migrate.engine import migrate_source

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SCRIPT = HERE / "scripts" / "comments_around_amp.py"
# The statements migrate rewrites in SCRIPT: (first line, last line, how that first line starts). Lines in
# the autocast region come out indented one level deeper, and only that.
REWRITTEN = [
    (7, 12, "try:"),  # apex's import guard: goes
    (20, 20, "def train_model("),  # gets the GradScaler parameter
    (31, 33, "            with amp.scale_loss("),  # becomes scaler.scale(loss).backward()
    (37, 37, "        optimizer.step()"),  # becomes scaler.step / scaler.update
    (47, 51, "if fp16:"),  # amp.initialize: the GradScaler above it, the `if` goes
    (57, 58, "model = train_model("),  # passes the GradScaler
]
AUTOCAST_REGION = (26, 28)


def _comments(source: bytes):
    return [token.string for token in tokenize.tokenize(io.BytesIO(source).readline) if token.type == tokenize.COMMENT]


def _in_order(wanted, lines):
    """Whether every line of `wanted` is in `lines`, in that order; the first that is not, else None."""
    position = 0
    for line in wanted:
        try:
            position = lines.index(line, position) + 1
        except ValueError:
            return line
    return None


@pytest.fixture(scope="module")
def migrated():
    result = migrate_source(SCRIPT.read_bytes())
    assert result.exit_status == 0 and result.changed
    return result.migrated.decode().splitlines(keepends=True)


def test_the_fixture_is_what_the_table_says():
    lines = SCRIPT.read_text().splitlines()
    for first, _, start in REWRITTEN:
        assert lines[first - 1].startswith(start), (first, lines[first - 1])
    assert lines[AUTOCAST_REGION[0] - 1].strip() == "outputs = model(inputs)  # logits"


def test_every_line_outside_the_rewritten_statements_survives_in_order(migrated):
    original = SCRIPT.read_text().splitlines(keepends=True)
    rewritten = {number for first, last, _ in REWRITTEN for number in range(first, last + 1)}
    region = range(AUTOCAST_REGION[0], AUTOCAST_REGION[1] + 1)
    expected = [("    " if number in region else "") + line for number, line in enumerate(original, start=1)
                if number not in rewritten]
    assert _in_order(expected, migrated) is None


def test_full_line_comments_inside_the_rewritten_statements_survive_byte_for_byte(migrated):
    original = SCRIPT.read_text().splitlines(keepends=True)
    inside = [original[number - 1] for first, last, _ in REWRITTEN for number in range(first, last + 1)
              if original[number - 1].lstrip().startswith("#")]
    assert inside == ["    # FusedSGD would go here\n", "    # a comment inside the handler\n",
                      "    #model = network_to_half(model)\n",
                      "    #optimizer_ft = FP16_Optimizer(optimizer_ft, static_loss_scale = 128.0)\n"]
    assert _in_order(inside, migrated) is None


def test_commented_out_code_after_a_removed_block_keeps_its_place_and_bytes(migrated):
    tail = ["#if torch.cuda.get_device_capability()[0]>6:\n", "#    torch.set_float32_matmul_precision('high')\n",
            "    # https://example.com/a-note-indented-inside-the-if\n", "#    model = torch.compile(model)\n",
            "model = train_model(model, criterion, optimizer_ft,\n"]
    start = migrated.index(tail[0])
    assert migrated[start:start + len(tail)] == tail
    assert migrated.index("scaler = torch.amp.GradScaler(\"cpu\", enabled=bool(fp16))\n") < start


def test_comments_of_rewritten_lines_are_all_kept(migrated):
    assert Counter(_comments("".join(migrated).encode())) - Counter(_comments(SCRIPT.read_bytes())) == Counter(
        {comment: 1 for comment in _comments("".join(migrated).encode()) if comment.startswith("# apexlite migrate")
         or comment.startswith("#     ")})  # only migrate's own note was added
    assert not Counter(_comments(SCRIPT.read_bytes())) - Counter(_comments("".join(migrated).encode()))


def _cases():
    with open(HERE / "golden" / "cases.tsv", newline="") as handle:
        golden = [HERE / "golden" / f"{row['name']}.in.py" for row in csv.DictReader(handle, delimiter="\t")]
    return golden + sorted((ROOT / "examples").glob("*amp*.py")) + [SCRIPT]


@pytest.mark.parametrize("path", _cases(), ids=lambda path: path.name)
def test_no_comment_of_the_input_is_ever_lost(path):
    source = path.read_bytes()
    result = migrate_source(source)
    missing = Counter(_comments(source)) - Counter(_comments(result.migrated))
    assert not missing, f"lost comments: {sorted(missing)}"
