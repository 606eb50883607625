"""Gradient communication in bf16/fp16 with pre-division, and FSDP2 with apexlite loss scaling (2 ranks)."""
from __future__ import annotations

import math

import pytest
import torch

from apexlite import torch_floor
from tests._helpers.tolerances import dtype_tols
from tests.parallel import _workers
from tests.parallel._launch import run_ranks
from tests.parallel._workers_sharded import comm_dtypes, fsdp_loss_scaling


@pytest.fixture(scope="module")
def comm():
    return run_ranks(comm_dtypes, timeout=60)


@pytest.fixture(scope="module")
def fsdp():
    if torch_floor.parse(torch.__version__) < (2, 6) and not torch.cuda.is_available():
        pytest.skip("torch 2.5's FSDP2 runs on CUDA only ('FSDP requires CUDA for streams'); on CPU it needs torch >= 2.6")
    return run_ranks(fsdp_loss_scaling, timeout=60)


def test_low_precision_gradient_communication_trains_like_fp32(comm):
    r0, r1 = comm
    reference = r0["O0-fp32"]["losses"]
    assert reference[-1] < 0.6 * reference[0]  # it trains
    for name, max_gap in (("O0-bf16", 0.01), ("O0-fp16", 0.002), ("O2-fp16", 0.002), ("O2-bf16", 0.01)):
        losses = r0[name]["losses"]
        assert abs(losses[-1] - reference[-1]) <= max_gap * reference[0], (name, losses[-1], reference[-1])
        for p0, p1 in zip(r0[name]["params"], r1[name]["params"]):
            assert torch.equal(p0, p1), name
        tols = dtype_tols(torch.bfloat16 if "bf16" in name else torch.float16)
        for p, ref in zip(r0[name]["params"], r0["O0-fp32"]["params"]):
            torch.testing.assert_close(p, ref, **tols)
    # the hook really reduced in low precision: bf16 rounding shows up in the fp32 params
    assert any(not torch.equal(p, ref) for p, ref in zip(r0["O0-bf16"]["params"], r0["O0-fp32"]["params"]))


def test_o2_fp16_reduced_grads_feed_fused_adam_directly(comm):
    r0, r1 = comm
    # the optimizer saw only the fp16 grads DDP reduced (no fp32 gradient copy), and updated fp32
    # masters of its own; the result tracks O2's fp32-master-grad path with torch AdamW
    assert r0["O2-fusedadam"]["grad_dtypes"] == {"torch.float16"}
    assert r0["O2-adamw"]["grad_dtypes"] == {"torch.float32"}
    for p0, p1 in zip(r0["O2-fusedadam"]["params"], r1["O2-fusedadam"]["params"]):
        assert torch.equal(p0, p1)
    for p, ref in zip(r0["O2-fusedadam"]["params"], r0["O2-adamw"]["params"]):
        torch.testing.assert_close(p, ref, **dtype_tols(torch.bfloat16))


def test_predivision_keeps_fp16_sums_finite(comm):
    probe = comm[0]["predivide"]
    # each rank's grad is 40000: the mean is 40000, the raw fp16 sum 80000 is past fp16's 65504
    assert probe["fp16-pre"].item() == 40000.0
    assert probe["fp32-to-fp16-wire"].item() == 40000.0
    assert math.isinf(probe["fp16-post"].item())
    # an fp32 wire sums and averages in fp32, then writes the mean back (apex's allreduce_always_fp32): the
    # sum went back into the fp16 bucket before the division once, and came out inf
    assert probe["fp16-to-fp32-wire-post"].item() == 40000.0
    assert probe["apex-allreduce-always-fp32"].item() == 40000.0


def test_a_sum_is_still_predivided(comm):
    """gradient_average=False sums; a predivide factor still divides the sum, as apex did (2 ranks, grads 1.0)."""
    for rank in comm:
        assert rank["sums"] == {"sum ddp_from_apex_args": 2.0, "sum DistributedDataParallel": 2.0,
                                "sum-predivided-4 ddp_from_apex_args": 0.5,
                                "sum-predivided-4 DistributedDataParallel": 0.5}


def test_apex_arguments_map_onto_ddp(comm):
    probes = [r["apex-args"] for r in comm]
    assert probes[0]["reduce_dtype"] is torch.float32
    assert probes[0]["factors"] == (1.0, 0.5)  # legacy default: divide after the sum
    assert all(probe["spare_grad"] is None for probe in probes)  # an unused param trained past, as apex allowed
    for g0, g1 in zip(probes[0]["grads"], probes[1]["grads"]):
        assert torch.equal(g0, g1)
    # the averaged grad equals the full-batch grad of a single process
    model = _workers.tiny_model()
    x, y = _workers.batches(1)[0]
    torch.nn.functional.mse_loss(model(x), y).backward()
    for g, p in zip(probes[0]["grads"], model.parameters()):
        torch.testing.assert_close(g, p.grad, **dtype_tols(torch.float32))


def test_fsdp_trains_close_to_single_process(fsdp):
    reference = _workers.single_process_run("O0")
    for level in ("O0", "O1"):
        for p0, p1 in zip(fsdp[0][level], fsdp[1][level]):
            assert torch.equal(p0, p1), level
        for p, ref in zip(fsdp[0][level], reference.values()):
            torch.testing.assert_close(p, ref, rtol=1e-2, atol=1e-2)


def test_fsdp_one_shard_overflow_skips_on_every_rank(fsdp):
    # inf in rank 1's gradient shard only: both ranks skip, keep their shards and back off
    assert [r["synced"]["unchanged"] for r in fsdp] == [True, True]
    assert [r["synced"]["scale"] for r in fsdp] == [2.0 ** 11, 2.0 ** 11]
    # FSDP2's grads are DTensors, whose unscale-and-check op already reduces the flag over the
    # mesh; apexlite's all-reduce (tested without DTensor in test_ddp) is then redundant, not needed
    assert [r["unsynced"]["unchanged"] for r in fsdp] == [True, True]
    assert [r["unsynced"]["scale"] for r in fsdp] == [2.0 ** 10, 2.0 ** 10]


def test_fsdp_refuses_opt_levels_that_cast_the_model(fsdp):
    refused = fsdp[0]["refused"]
    assert set(refused) == {"O2", "O3", "half-model", "amp.initialize O2", "amp.initialize O3", "FSDP1"}
    assert "FSDP1" in refused["FSDP1"] and "fully_shard" in refused["FSDP1"]
    assert "not supported with FSDP" in refused["O2"] and "master" in refused["O2"]
    for level in ("O2", "O3"):
        assert "FSDP2-sharded" in refused[f"amp.initialize {level}"]
        assert "initialize_fsdp" in refused[f"amp.initialize {level}"]
    assert "MixedPrecisionPolicy" in refused["half-model"]
