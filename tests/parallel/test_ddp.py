"""apexlite O0-O3 under real 2-rank DDP (gloo): parity with one process, overflow agreement, checkpoints."""
from __future__ import annotations

import torch

from tests._helpers.tolerances import dtype_tols
from tests.parallel import _workers
from tests.parallel._launch import run_ranks

LEVELS = ["O0", "O1", "O2", "O3"]
# O3 trains fp16 params; two processes sum the batch in a different order than one
LEVEL_TOLS = {"O0": dtype_tols(torch.float32), "O1": dtype_tols(torch.float16),
              "O2": dtype_tols(torch.float16), "O3": dict(rtol=1e-2, atol=1e-2)}


def _assert_close_dicts(actual, expected, **tols):
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], **tols, msg=lambda m: f"{key}: {m}")


def _assert_equal_dicts(a, b):
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_ddp_opt_levels_match_single_process_and_agree_across_ranks():
    ranks = run_ranks(_workers.ddp_opt_levels, LEVELS, timeout=60)
    for level in LEVELS:
        _assert_equal_dicts(ranks[0][level], ranks[1][level])
        reference = _workers.single_process_run(level)
        _assert_close_dicts(ranks[0][level], reference, **LEVEL_TOLS[level])
    # different init per rank: after apexlite's DDP or apex's (the import surface's), both the model and the
    # fp32 masters are rank 0's; after torch's, the masters are rebuilt from rank 0's broadcast weights
    for label in ("O2-rank-seeded", "O2-rank-seeded-apex-ddp", "O2-rank-seeded-torch-ddp"):
        _assert_equal_dicts(ranks[0][label], ranks[1][label])
        for m0, m1 in zip(ranks[0][f"{label}-masters"], ranks[1][f"{label}-masters"]):
            assert torch.equal(m0, m1), label
        _assert_close_dicts(ranks[0][label], ranks[0]["O2"], **LEVEL_TOLS["O2"])


def test_one_rank_overflow_skips_on_every_rank():
    ranks = run_ranks(_workers.ddp_overflow, "O1", timeout=60)
    synced = [r["grad-inf-synced"] for r in ranks]
    # the inf was put into rank 1's grad only, after DDP's all-reduce: the flag all-reduce spreads it
    assert all(r["unchanged"] for r in synced)
    assert [r["scale"] for r in synced] == [2.0 ** 15, 2.0 ** 15]
    assert all(r["next"]["stepped"] for r in synced)
    # without the flag all-reduce the decisions split: what the all-reduce is for
    unsynced = [r["grad-inf-unsynced"] for r in ranks]
    assert unsynced[0]["stepped"] and unsynced[1]["unchanged"]
    assert [r["scale"] for r in unsynced] == [2.0 ** 16, 2.0 ** 15]
    # an overflowing LOSS on rank 1 reaches every rank through DDP's gradient average itself
    loss_inf = [r["loss-inf-unsynced"] for r in ranks]
    assert all(r["unchanged"] for r in loss_inf)
    assert [r["scale"] for r in loss_inf] == [2.0 ** 15, 2.0 ** 15]


def test_checkpoint_from_rank0_resumes_every_rank(tmp_path):
    ranks = run_ranks(_workers.ddp_checkpoint, str(tmp_path / "ckpt.pt"), timeout=60)
    for result in ranks:
        assert result["loaded_scale"] == {"loss_scale": 2.0 ** 15, "unskipped": 2}
        _assert_equal_dicts(result["resumed"], result["uninterrupted"])
    _assert_equal_dicts(ranks[0]["resumed"], ranks[1]["resumed"])


ACCUMULATION = [("O1", "SGD"), ("O2", "SGD"), ("O2", "FusedAdam")]


def test_accumulation_under_no_sync_reaches_every_rank_at_o1_and_is_warned_at_o2():
    """A micro-batch run under DDP's no_sync() is all-reduced with the next one at O1, as with torch.amp: scale_loss
    once set its grads aside during that backward (as apex did), and each rank added back its own (0.1 apart
    after 3 steps). The reference: the same run with delay_unscale=True on the no_sync blocks, bit for bit. At O2
    the earlier grads stay summed in fp32 on the masters (exact where every micro-batch all-reduces): a warning
    names delay_unscale=True, and that recipe keeps the ranks together."""
    ranks = run_ranks(_workers.ddp_no_sync_accumulation, ACCUMULATION, timeout=90)
    for rank in ranks:
        for level, kind in ACCUMULATION:
            assert rank[(level, kind, True)]["warnings"] == []
            warned = [message for message in rank[(level, kind, False)]["warnings"] if "no_sync()" in message]
            assert len(warned) == (level == "O2"), (level, kind, warned)
    for level, kind in ACCUMULATION:
        _assert_equal_dicts(ranks[0][(level, kind, True)]["params"], ranks[1][(level, kind, True)]["params"])
    _assert_equal_dicts(ranks[0][("O1", "SGD", False)]["params"], ranks[1][("O1", "SGD", False)]["params"])
    _assert_equal_dicts(ranks[0][("O1", "SGD", False)]["params"], ranks[0][("O1", "SGD", True)]["params"])


def test_an_overflow_in_one_no_sync_micro_batch_lowers_the_scale_once():
    """The overflowed grads of a skipped step go before the next micro-batch: kept, each later micro-batch added
    to them in place and found the overflow again (4 micro-batches: the scale fell 16x, not 2x)."""
    for result in run_ranks(_workers.ddp_no_sync_overflow, 4, timeout=90):
        assert result["unchanged"]
        assert result["scale_after"] == result["scale_before"] / 2


def test_zero_redundancy_optimizer_is_refused_at_o2_and_trains_at_o1():
    """At O2 the fp32 masters replace the params in ZeroRedundancyOptimizer's groups, in none of its shards: the
    model did not train, silently. Refused; at O1 it trains as torch's unsharded Adam does, bit for bit."""
    ranks = run_ranks(_workers.zero_redundancy, timeout=90)
    for result in ranks:
        assert result[("O2", True)].startswith("AmpConfigError") and "ZeroRedundancyOptimizer" in result[("O2", True)]
        _assert_equal_dicts(result[("O1", True)], result[("O1", False)])
    _assert_equal_dicts(ranks[0][("O1", True)], ranks[1][("O1", True)])
