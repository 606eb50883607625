"""apexlite: apex.amp-style mixed-precision training for modern PyTorch.

    model, optimizer = apexlite.initialize(model, optimizer, opt_level="O1")
    with apexlite.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()

`apexlite.install()` makes `import apex` resolve to apexlite in this process and the ones it starts.
"""
import torch as _torch

from apexlite.torch_floor import warn_if_unsupported as _warn_if_unsupported

_warn_if_unsupported(_torch.__version__)

from apexlite import amp  # noqa: E402  (after the torch check, which must speak before anything fails)
from apexlite.amp import deinitialize, initialize, scale_loss  # noqa: E402
from apexlite.compat.install import install  # noqa: E402
from apexlite.parallel import overflow as _overflow_agreement  # noqa: E402,F401  (plugs itself into amp)

__version__ = "0.1.0"

__all__ = ["amp", "initialize", "deinitialize", "scale_loss", "install", "__version__"]
