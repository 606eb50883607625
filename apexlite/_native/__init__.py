"""Finding, compiling and loading apexlite's compiled kernels (csrc/), one concern per module.

* build_plan: what is compiled, with which flags, and whether this machine can (standard library only:
  setup.py loads it by path, before torch is importable);
* jit_build: the first-use build's cache folders and the compile itself;
* kernel_state: what exists, found without compiling (doctor's view);
* loader: loads the kernels once per process, compiling them on first use when the install has none.

Nothing here imports torch at package import: setup.py loads build_plan alone.
"""
