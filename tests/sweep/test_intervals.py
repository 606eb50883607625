"""sweep.intervals: the per-round speed ratio and its distribution-free interval, on synthetic timings whose
true ratio is known."""
import math
import random
import statistics

import pytest

from apexlite.sweep import intervals
from apexlite.sweep.intervals import MIN_ROUNDS, SpeedRatio, coverage, median_interval, speed_ratio


def _binomial_coverage(n, k):
    """P(x_(k) <= median <= x_(n+1-k)) by counting, for every number of draws below the median."""
    return sum(math.comb(n, below) for below in range(k, n - k + 1)) / 2 ** n


@pytest.mark.parametrize("n", [6, 7, 10, 13, 20, 41])
def test_coverage_formula_counts_the_draws_below_the_median(n):
    for k in range(1, n // 2 + 1):
        assert coverage(n, k) == pytest.approx(_binomial_coverage(n, k), abs=1e-12)


@pytest.mark.parametrize("n,ranks", [(6, (1, 6)), (8, (1, 8)), (9, (2, 8)), (12, (3, 10)), (20, (6, 15)),
                                     (30, (10, 21))])
def test_interval_takes_the_standard_sign_test_ranks(n, ranks):
    values = list(range(1, n + 1))  # value i is rank i
    assert median_interval(values) == ranks


@pytest.mark.parametrize("n", range(0, MIN_ROUNDS))
def test_fewer_than_six_rounds_give_no_interval(n):
    assert median_interval([1.0] * n) is None
    assert speed_ratio([1.0] * n, [2.0] * n).measured is False


NOISE = {
    "gaussian 5%": lambda rng: rng.gauss(1.0, 0.05),
    "lognormal heavy tail": lambda rng: rng.lognormvariate(0.0, 0.5),
    "one round in five 10x slower": lambda rng: 10.0 if rng.random() < 0.2 else rng.gauss(1.0, 0.03),
    "cauchy-like ratio of normals": lambda rng: abs(rng.gauss(1.0, 0.3) / rng.gauss(1.0, 0.3)),
}


@pytest.mark.parametrize("name", NOISE)
def test_the_interval_covers_the_true_ratio_at_least_95_percent_of_the_time(name):
    """Noise on the other run's step time only: the true median ratio is 2 / median(noise)."""
    rng = random.Random(7)
    draw = NOISE[name]
    reference_rng = random.Random(99)
    true_noise_median = statistics.median(draw(reference_rng) for _ in range(100_001))
    truth = 2.0 / true_noise_median
    trials, covered = 1500, 0
    for _ in range(trials):
        rounds = rng.choice([6, 9, 14, 25])
        reference = [2.0e-3] * rounds
        other = [1.0e-3 * draw(rng) for _ in range(rounds)]
        ratio = speed_ratio(reference, other)
        covered += ratio.low <= truth <= ratio.high
    assert covered / trials >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / trials)  # 95%, less three standard errors


def test_heavy_tails_move_the_median_ratio_little_and_the_mean_a_lot():
    rng = random.Random(3)
    reference = [1e-3 * rng.gauss(1.0, 0.02) for _ in range(30)]
    other = [0.5e-3 * (10.0 if index % 5 == 0 else rng.gauss(1.0, 0.02)) for index in range(30)]  # 6 bad rounds
    ratio = speed_ratio(reference, other)
    assert ratio.low <= 2.0 <= ratio.high and ratio.verdict == "faster"
    assert abs(ratio.estimate - 2.0) < 0.1
    mean_ratio = statistics.mean(r / o for r, o in zip(reference, other))
    assert abs(mean_ratio - 2.0) > 0.3  # what an average would have claimed


def test_clearly_different_runs_do_not_overlap_one_and_say_which_is_faster():
    rng = random.Random(5)
    fast = [1e-3 * rng.gauss(1.0, 0.05) for _ in range(12)]
    slow = [2.5e-3 * rng.gauss(1.0, 0.05) for _ in range(12)]
    faster, slower = speed_ratio(slow, fast), speed_ratio(fast, slow)
    assert faster.verdict == "faster" and faster.low > 1 and faster.low <= 2.5 <= faster.high
    assert slower.verdict == "slower" and slower.high < 1 and slower.low <= 0.4 <= slower.high


def test_runs_from_the_same_distribution_show_no_measurable_difference():
    rng = random.Random(11)
    first = [1e-3 * rng.gauss(1.0, 0.05) for _ in range(20)]
    second = [1e-3 * rng.gauss(1.0, 0.05) for _ in range(20)]
    ratio = speed_ratio(first, second)
    assert ratio.low < 1 < ratio.high and ratio.verdict == "no measurable difference"


def test_pairing_removes_drift_both_runs_saw():
    """The machine slows 3x over the rounds: the paired ratio stays tight, the unpaired medians do not."""
    drift = [1 + 2 * index / 19 for index in range(20)]
    rng = random.Random(2)
    reference = [2e-3 * d * rng.gauss(1.0, 0.02) for d in drift]
    other = [1e-3 * d * rng.gauss(1.0, 0.02) for d in drift]
    ratio = speed_ratio(reference, other)
    assert ratio.low <= 2.0 <= ratio.high and ratio.precise_to(0.05)
    unpaired_low = min(reference) / max(other)
    assert unpaired_low < 1  # comparing all rounds with all rounds could not even tell which is faster


def test_rounds_one_run_missed_are_left_out_of_the_pairs():
    ratio = speed_ratio([2.0, None, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0], [1.0, 1.0, None, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert ratio.rounds == 6 and (ratio.estimate, ratio.low, ratio.high) == (2.0, 2.0, 2.0)


def test_an_interval_too_wide_is_not_a_measurement():
    wide = SpeedRatio(1.2, 0.7, 0.7 * intervals.MAX_SPREAD * 1.01, 8)
    assert not wide.measured and wide.verdict == "not measured"
    narrow = SpeedRatio(1.2, 1.1, 1.1 * intervals.MAX_SPREAD, 8)
    assert narrow.measured and narrow.verdict == "faster"


@pytest.mark.parametrize("low,high,precision,precise", [(0.96, 1.04, 0.05, True), (0.94, 1.04, 0.05, False),
                                                        (0.91, 1.09, 0.1, True)])
def test_precision_is_the_larger_distance_from_the_estimate(low, high, precision, precise):
    assert SpeedRatio(1.0, low, high, 10).precise_to(precision) is precise


def test_text_always_carries_the_interval_or_says_why_there_is_none():
    assert SpeedRatio(2.3125, 2.1, 2.52, 12).text() == "2.31x [2.10, 2.52]"
    assert SpeedRatio(2.0, None, None, 3).text() == "not measured (3 rounds; 6 give an interval)"
    assert SpeedRatio(None, None, None, 0).text() == "not measured (no round timed both)"
