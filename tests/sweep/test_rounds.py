"""sweep.rounds: which steps count, how long a slice is, and how repeats pool."""
import pytest

from apexlite.sweep import rounds
from apexlite.sweep.children import Slice
from apexlite.sweep.rounds import WAIT_SHARE, RoundTimes

PAIR = ("O1", "float16")


def _times():
    return RoundTimes.empty([PAIR])


def test_steps_that_waited_for_a_cpu_are_left_out_of_the_round():
    times = _times()
    walls = [1e-3, 1.1e-3, 9e-3, 1.2e-3]
    waited = [0.0, WAIT_SHARE * 1.1e-3, 8e-3, 0.2 * 1.2e-3]  # the last two waited longer than their share
    times.add(PAIR, Slice(walls, waited))
    assert times.wall[PAIR] == [pytest.approx(1.05e-3)] and (times.steps[PAIR], times.disturbed[PAIR]) == (4, 2)


def test_a_slice_that_mostly_waited_does_not_count():
    times = _times()
    times.add(PAIR, Slice([1e-3] + [5e-3] * 4, [0.0] + [4e-3] * 4))  # 1 calm step in 5: under a quarter
    times.add(PAIR, Slice([1e-3] * 2 + [5e-3] * 6, [0.0] * 2 + [4e-3] * 6))  # 2 in 8: a quarter
    assert times.wall[PAIR] == [None, 1e-3]


def test_without_schedstat_every_step_counts_and_that_is_recorded():
    times = _times()
    times.add(PAIR, Slice([1e-3, 3e-3, 2e-3], [None, None, None]))
    assert times.wall[PAIR] == [2e-3] and times.waits_visible is False


def test_a_missing_slice_is_a_gap_in_the_rounds():
    times = _times()
    times.add(PAIR, None)
    times.add(PAIR, Slice([], []))
    assert times.wall[PAIR] == [None, None] and times.steps[PAIR] == 0


@pytest.mark.parametrize("recent,steps_left,rounds_done,expected", [
    ([], None, 0, 1),  # the first slice: one step, to learn the step time
    ([0.01], None, 1, 10),  # about SLICE_S (0.1 s) of 10 ms steps
    ([1e-5], None, 1, rounds.MAX_SLICE_STEPS),
    ([2.0], None, 1, 1),  # a step longer than a slice: one
    ([0.001], 120, 0, 9),  # --max-steps: leave steps for TARGET_ROUNDS (12) rounds, one untimed step each
    ([0.001], 17, 0, 1),  # --max-steps 20 after 3 warm-up steps: 8 rounds of 1 + 1 steps
    ([0.001], 5, 11, 4),
    ([0.001], 0, 20, 1),
])
def test_slice_length(recent, steps_left, rounds_done, expected):
    assert rounds._slice_steps(recent, steps_left, rounds_done) == expected


def test_repeats_append_their_rounds():
    first, second = _times(), _times()
    first.add(PAIR, Slice([1e-3], [0.0]))
    first.rounds = 1
    second.add(PAIR, Slice([2e-3], [None]))
    second.rounds, second.stopped = 1, "budget"
    first.extend(second)
    assert first.wall[PAIR] == [1e-3, 2e-3] and first.rounds == 2 and first.steps[PAIR] == 2
    assert first.stopped == "budget" and first.waits_visible is False
