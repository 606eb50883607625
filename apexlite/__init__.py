"""apexlite: apex.amp-style mixed-precision training for modern PyTorch.

    model, optimizer = apexlite.initialize(model, optimizer, opt_level="O1")
    with apexlite.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()

`apexlite.install()` makes `import apex` resolve to apexlite in this process and the ones it starts.
"""
from apexlite import amp
from apexlite.amp import deinitialize, initialize, scale_loss
from apexlite.compat.install import install
from apexlite.parallel import overflow as _overflow_agreement  # noqa: F401  (plugs itself into amp)

__version__ = "0.1.0"

__all__ = ["amp", "initialize", "deinitialize", "scale_loss", "install", "__version__"]
