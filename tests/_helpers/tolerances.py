"""The one place test tolerances are defined, keyed by dtype."""
import torch

_TOLS = {
    torch.float32: dict(rtol=1.3e-6, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
}


def dtype_tols(dtype: torch.dtype) -> dict:
    """rtol/atol for comparing results computed in `dtype` against an fp32 reference."""
    return dict(_TOLS[dtype])
