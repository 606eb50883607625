"""A folder the runner puts first on the path of every process a run starts (spawn, subprocess).

It holds `sitecustomize`, which every new interpreter imports at start-up: it installs a small
finder ahead of everything on `sys.path`, so `apex`, `amp_C` and apex's other top-level modules resolve
to apexlite in the child exactly as in the run's own process, and answers `importlib.metadata` for
`apex`. It also holds stand-ins for the top-level legacy names apexlite provides (`apex`, `amp_C`,
`fused_layer_norm_cuda`, ...: sitecustomize.LEGACY_TOP_LEVEL) for children started without site (`python -S`),
which find them on `sys.path` (multiprocessing copies it) or `PYTHONPATH`. Outside `apexlite run`
the folder is on no path.
"""
import os

CHILD_PATH = os.path.dirname(os.path.abspath(__file__))
