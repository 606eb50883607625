"""Finding, compiling and loading apexlite's compiled kernels (csrc/), one concern per module.

* build_plan: what is compiled, with which flags, and whether this machine can;
* build_time: how long a build should take here (its CPU seconds, from this machine's past builds);
* cpu_share: the share of the cores a build's jobs will get, from what runs now and in which session;
* build_progress: the steps done while a build runs;
* jit_build: the first-use build's cache folders and the compile itself;
* kernel_state: what exists, found without compiling (doctor's view);
* loader: loads the kernels once per process, compiling them on first use when the install has none.

build_plan, build_time, cpu_share and build_progress use the standard library only: setup.py loads
them, as a package of their own, before torch is importable. Nothing is imported here.
"""
