"""The legacy apex import surface, mapped onto apexlite.

`apexlite.compat.apex` is importable directly; under `python -m apexlite run SCRIPT` the import hook
(`apexlite.compat.hook`) also makes it answer to `import apex` / `from apex... import ...`, and
`apexlite.compat.amp_C`, `apexlite.compat.fused_layer_norm_cuda`, ... to apex's top-level extension
modules (`import amp_C`, ...). Importing this package installs nothing.
"""
from apexlite.compat._unsupported import ApexliteUnsupportedError
from apexlite.compat.hook import apex_aliases

__all__ = ["ApexliteUnsupportedError", "apex_aliases"]
