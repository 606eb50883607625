"""A folder the runner puts on the path of every process a run starts (spawn, subprocess).

It holds stand-ins for the top-level legacy names (`apex`, `amp_C`). The runner's import hook lives
in one process only; a child started with the `spawn` method or as a new interpreter gets this folder
through `sys.path` (multiprocessing copies it) and `PYTHONPATH`, and the first legacy import there
installs the hook in the child. Outside `apexlite run` the folder is on no path.
"""
import os

CHILD_PATH = os.path.dirname(os.path.abspath(__file__))
