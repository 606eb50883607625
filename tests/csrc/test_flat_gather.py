"""``apexlite::flat_gather_``: many tensors' memory into one flat buffer, on the CPU, through the CUDA
kernel's own source in the host emulation (marker ``cuda_host``), and on a real GPU (marker ``cuda``).

Every case is checked against ``torch.cat`` of the sources' values placed at their offsets, with the
flat buffer between guard bands: sources of both element sizes and all alignments (each of the CUDA
kernel's 16-, 4- and 2-byte paths), empty ones, a source cut into several chunks (256 KiB each), and
dense sources that are not contiguous (channels_last). The CUDA kernel runs one launch per call.
"""
from __future__ import annotations

import re

import pytest
import torch

from apexlite._native import loader as _ext
from tests.csrc import emulated_cuda

pytestmark = pytest.mark.skipif(not _ext.kernels_available("cpu"), reason="compiled CPU library not built")

CHUNK_BYTES = 1 << 18  # csrc/cuda/flat_gather.h
GUARD = 64
# sizes: aligned runs, odd sizes (2-byte path for 16-bit types, 4-byte for float32), an empty source,
# and one source of several chunks with a partial last one
SIZES = [8, 3, 0, 16, 1, 5, (3 * CHUNK_BYTES) // 4 + 7, 12]


def _sources(dtype, sizes=SIZES, seed=0):
    gen = torch.Generator().manual_seed(seed)
    sources = [torch.randn(n, generator=gen).to(dtype) for n in sizes]
    sources[3] = torch.randn(1, 4, 2, 2, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
    return sources


def _layout(sources):
    offsets, total = [], 0
    for source in sources:
        offsets.append(total)
        total += source.numel()
    return offsets, total


def _guarded(total, dtype, device="cpu"):
    whole = torch.full((total + 2 * GUARD,), -7.0, dtype=dtype, device=device)
    return whole, whole[GUARD:GUARD + total]


def _expected(sources, dtype):
    # memory order of each source: the channels_last one is read as it lies in memory
    flat = [s.permute(0, 2, 3, 1).reshape(-1) if s.dim() == 4 else s for s in sources]
    return torch.cat(flat).to(dtype)


def _check(whole, flat, sources, dtype):
    assert torch.equal(flat.cpu(), _expected(sources, dtype))
    guards = torch.cat([whole[:GUARD], whole[-GUARD:]]).cpu()
    assert torch.equal(guards, torch.full_like(guards, -7.0)), "a guard band was written"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_cpu_gather_places_every_source(dtype):
    sources = _sources(dtype)
    offsets, total = _layout(sources)
    whole, flat = _guarded(total, dtype)
    torch.ops.apexlite.flat_gather_(flat, sources, offsets)
    _check(whole, flat, sources, dtype)


@pytest.mark.cuda_host
@pytest.mark.parametrize("shift", [0, 1], ids=["aligned", "shifted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_emulated_cuda_gather_places_every_source_in_one_launch(dtype, shift):
    try:
        kernels = emulated_cuda.kernels()
    except emulated_cuda.CompilerMissing as missing:
        pytest.skip(str(missing))
    sources = _sources(dtype)
    offsets, total = _layout(sources)
    whole, flat = _guarded(total + shift, dtype)
    flat = flat[shift:]
    kernels.take_launches()
    kernels.flat_gather_(flat, sources, offsets)
    assert torch.equal(flat, _expected(sources, dtype))
    assert torch.equal(whole[:GUARD], torch.full((GUARD,), -7.0, dtype=dtype))
    assert torch.equal(whole[-GUARD:], torch.full((GUARD,), -7.0, dtype=dtype))
    size = sources[0].element_size()
    entries = sum(-(-s.numel() * size // CHUNK_BYTES) for s in sources)
    assert kernels.take_launches() == [(entries, 256)]


BAD_ARGUMENTS = {
    "other dtype": (lambda f, s, o: (f, [s[0].double()] + s[1:], o), "sources[0] must be a dense"),
    "strided source": (lambda f, s, o: (f, [torch.randn(16)[::2]] + s[1:], o), "sources[0] must be a dense"),
    "offset past the end": (lambda f, s, o: (f, s, o[:-1] + [f.numel()]), "does not fit in flat"),
    "too few offsets": (lambda f, s, o: (f, s, o[:-1]), "give one offset per source"),
    "2-d flat": (lambda f, s, o: (f.view(1, -1), s, o), "flat must be a contiguous 1-D"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_invalid_arguments_are_rejected_with_a_reason(case):
    sources = [torch.randn(8), torch.randn(4)]
    breaker, pattern = BAD_ARGUMENTS[case]
    flat, sources, offsets = breaker(torch.zeros(12), sources, [0, 8])
    with pytest.raises(RuntimeError, match=re.escape(pattern)):
        torch.ops.apexlite.flat_gather_(flat, sources, offsets)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shift", [0, 1], ids=["aligned", "shifted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_gather_places_every_source_without_sync(dtype, shift):
    if not _ext.kernels_available("cuda"):
        pytest.skip(f"CUDA kernel not built ({_ext.kernel_detail('cuda')})")
    from tests.csrc.test_fused_adam_cuda import no_host_sync
    sources = [s.cuda() for s in _sources(dtype)]
    offsets, total = _layout(sources)
    whole, flat = _guarded(total + shift, dtype, "cuda")
    flat = flat[shift:]
    with no_host_sync():
        torch.ops.apexlite.flat_gather_(flat, sources, offsets)
    assert torch.equal(flat.cpu(), _expected([s.cpu() for s in sources], dtype))
    guards = torch.cat([whole[:GUARD], whole[-GUARD:]]).cpu()
    assert torch.equal(guards, torch.full_like(guards, -7.0))
