"""migrate --verify's precision check: training layers that lost low precision decide; no_grad ones are noted."""
import pytest

from apexlite.migrate.precision import check_precision

LOW = {"torch.float16": 8}
HALF = {"torch.float16": 4, "torch.float32": 4}
FP32 = {"torch.float32": 8}

CASES = [
    # original, migrated, lost, a no_grad note
    ({"training": LOW}, {"training": LOW}, False, False),
    ({"training": LOW}, {"training": HALF}, True, False),
    ({"training": FP32}, {"training": FP32}, False, False),  # O0: float32 on both sides
    ({"training": HALF}, {"training": LOW}, False, False),  # more low precision is not a loss
    ({"training": LOW, "no_grad": LOW}, {"training": LOW, "no_grad": FP32}, False, True),
    ({"training": {"torch.float16": 99, "torch.float32": 1}}, {"training": {"torch.float16": 100}}, False, False),
    ({"training": {}}, {"training": {}}, False, False),  # no layer ran (a model of other layers)
    ({"training": LOW}, {"training": {}}, False, False),  # nothing counted on one side: no verdict
]


@pytest.mark.parametrize("original,migrated,lost,noted", CASES)
def test_check_precision(original, migrated, lost, noted):
    check = check_precision(original, migrated)
    assert (check.lost is not None) == lost
    assert any("forwards under no_grad run in float32 now" in line for line in check.lines) == noted
    if lost:
        assert "ran 50% of its training layers in float32, where the original ran 100% of them" in check.lost


def test_the_shares_are_printed_per_grad_mode():
    check = check_precision({"training": LOW, "no_grad": LOW}, {"training": HALF, "no_grad": LOW})
    assert check.lines == [
        "verify: Linear/Conv layers returning float16/bfloat16 while training: original 100% (8 of 8), migrated 50% "
        "(4 of 8)",
        "verify: Linear/Conv layers returning float16/bfloat16 under no_grad (evaluation, a teacher): original 100% "
        "(8 of 8), migrated 100% (8 of 8)"]
