"""Build script: apexlite is pure Python plus compiled kernels that no install ever fails for.

* The kernel sources (csrc/) travel in every sdist and wheel, as the package data ``apexlite/_csrc``.
* When torch is importable at build time (``pip install --no-build-isolation``), the install compiles
  the CPU library ``apexlite._C`` (FusedAdam's CPU kernel, O1's native casts) against that torch, if
  a C++ compiler and Python's headers are there. The CUDA kernel joins it only with ``APEXLITE_CUDA=1``.
* Whatever is not compiled at install (pip's default build isolation hides torch from the build; no
  compiler; a compile error; a CUDA toolkit that does not match torch's CUDA) is compiled on first use,
  once per torch version, and cached (apexlite/_native/loader.py); until then, and if that fails too, apexlite
  uses torch's own ops. The install says what it did not build in one line, and records it in
  ``apexlite/_build_record.json`` for ``python -m apexlite doctor``.
* ``APEXLITE_REQUIRE_EXTENSION=1`` turns "not built" into an install error (CI uses it);
  ``APEXLITE_BUILD_EXTENSION=0`` compiles nothing. Parallel jobs: ``MAX_JOBS``, default the usable cores.
  ``TORCH_CUDA_ARCH_LIST`` defaults to the visible GPU's, or 9.0 without one.
"""
import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import setuptools
from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
RECORD = "_build_record.json"


def _load_native():
    """apexlite/_native's standard-library modules (build_plan, build_time, build_progress), loaded as a
    package of their own: importing apexlite here would need torch and wrapt."""
    folder = ROOT / "apexlite" / "_native"
    spec = importlib.util.spec_from_file_location("_apexlite_native", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package  # its modules' relative imports, and dataclasses, find it by name
    spec.loader.exec_module(package)
    return [importlib.import_module(f"{spec.name}.{name}") for name in ("build_plan", "build_time", "build_progress")]


plan, build_time, build_progress = _load_native()
_SETUPTOOLS_OBSTACLE = plan.setuptools_obstacle(setuptools.__version__)
if _SETUPTOOLS_OBSTACLE:
    sys.exit(f"apexlite: {_SETUPTOOLS_OBSTACLE}")


def say(message):
    """One line of the install's own report (pip shows it with -v; scripts/setup.sh always shows it)."""
    sys.stderr.write(f"apexlite: {message}\n")
    sys.stderr.flush()


def write_record(package_dir, torch_version, cpu, cuda):
    """What the install compiled, for the run-time loader and doctor (apexlite/_native/kernel_state.py reads it)."""
    Path(package_dir).mkdir(parents=True, exist_ok=True)
    record = {"torch": torch_version, "abi": plan.abi_tag(), "sources": plan.source_digest(CSRC),
              "cpu": cpu, "cuda": cuda}
    Path(package_dir, RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


class BuildPyWithKernelSources(build_py):
    """Copies csrc/ into the package as apexlite/_csrc, so a non-editable install can compile on first use.

    An editable install compiles from the checkout's csrc/ directly. Without torch at build time nothing
    else runs, so this also says so and records it.
    """

    def run(self):
        super().run()
        package_dir = ROOT / "apexlite" if self.editable_mode else Path(self.build_lib, "apexlite")
        if not self.editable_mode:
            target = package_dir / "_csrc"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(CSRC, target, ignore=shutil.ignore_patterns("__pycache__", "*.o", "*.so"))
        if SKIPPED is not None:
            torch_version, reason = SKIPPED
            if torch_version is None:  # nothing on this machine is missing: they can be compiled on first use
                later = f"CPU library: {plan.first_use_note('cpu', plan.parallel_jobs())}"
            else:  # the machine lacks something that a first use needs too
                later = ("FusedAdam and O1 use torch's ops until that is fixed; then they are compiled on first use "
                         f"(or with `{plan.DOCTOR_BUILD}`)")
            say(f"no kernels compiled at install: {reason}. {later}.")
            state = {"state": "not built", "detail": reason}
            write_record(package_dir, torch_version, state, state)


def _kernel_build_class(torch, cpp_extension, tools, install):
    """build_ext that compiles what `install` plans, says what it did in one line, and never fails the
    install for a native-build reason unless APEXLITE_REQUIRE_EXTENSION=1."""

    class KernelBuild(cpp_extension.BuildExtension):
        def run(self):
            # setuptools' run() clears `inplace` while it builds and does not restore it when the build raises
            self.into_source = self.inplace or getattr(self, "editable_mode", False)
            self.compiler_option = self.compiler  # run() replaces the option by the compiler object it makes
            jobs = plan.parallel_jobs()
            os.environ.setdefault("MAX_JOBS", str(jobs))
            cpu, cuda = self._compile(jobs, with_cuda=install.cuda.build)
            if cuda["state"] == "not built" and cpu["state"] == "built" and torch.version.cuda:
                obstacle = plan.cuda_obstacle(tools)
                say(f"CUDA kernel not built: {obstacle}; FusedAdam on a GPU uses torch's fused Adam ops (`python -m "
                    "apexlite doctor` shows this again)." if obstacle else
                    f"CUDA kernel not built ({cuda['detail']}); {plan.first_use_note('cuda', jobs, tools)}.")
            write_record(ROOT / "apexlite" if self.into_source else Path(self.build_lib, "apexlite"),
                         torch.__version__, cpu, cuda)

        def _compile(self, jobs, with_cuda):
            """(cpu, cuda) record entries after compiling, retrying without CUDA when the CUDA part fails."""
            self.inplace, self.compiler = self.into_source, self.compiler_option  # as before a failed attempt
            what = "CPU kernel, O1 casts" + (" and CUDA kernel" if with_cuda else "")
            if not with_cuda:  # in place: setuptools has already prepared this Extension object
                self.extensions[0].sources = _relative(plan.cpu_sources(CSRC))
                self.extensions[0].extra_compile_args = {"cxx": list(plan.CXX_FLAGS)}
            library = "cpu+cuda" if with_cuda else "cpu"
            machine, compiler, history = build_time.this_machine(jobs), plan.compiler_key(tools, library), \
                build_time.history_file()
            expected = build_time.estimate(library, machine, build_time.read_history(history), torch.__version__,
                                           compiler)
            say(f"compiling apexlite._C ({what}) against torch {torch.__version__}, {expected.about} "
                f"({expected.why})...")
            clock = build_time.Stopwatch()
            output = Path(self.build_temp, "compiler-output.txt")
            progress = build_progress.BuildProgress(Path(self.build_temp), len(self.extensions[0].sources),
                                                    "compiling apexlite._C", expected.about, say)
            try:
                with _stdout_to(output), progress:
                    super().run()
                if not os.path.exists(self._built_library()):
                    raise RuntimeError(f"the compiler produced no {self._built_library()}")
            except Exception as error:  # compiler, headers, toolkit: whatever it is, torch's ops remain
                if install.require:
                    raise
                reason = plan.first_error_line(_read(output) + "\n" + str(error))
                say(f"compiling apexlite._C ({what}) against torch {torch.__version__} failed after "
                    f"{clock.wall():.0f} s: {reason}")
                if with_cuda:
                    cpu, _ = self._compile(jobs, with_cuda=False)
                    return cpu, {"state": "failed", "detail": reason}
                self._remove_stale_inplace_library()
                say("FusedAdam and O1 use torch's ops; `python -m apexlite doctor` shows this again "
                    "(`pip install -v` shows the compiler's output).")
                return {"state": "failed", "detail": reason}, {"state": "not built", "detail": install.cuda.why_not}
            if progress.complete():
                build_time.remember(history, clock.finished(library, machine, torch.__version__, compiler))
            say(f"compiled apexlite._C ({what}) in {clock.wall():.0f} s (estimated: {expected.about})")
            built = {"state": "built", "detail": ""}
            return built, (built if with_cuda else {"state": "not built", "detail": install.cuda.why_not})

        def _built_library(self):
            return os.path.join(self.build_lib, self.get_ext_filename(self.get_ext_fullname("apexlite._C")))

        def _remove_stale_inplace_library(self):
            """An editable checkout's apexlite/_C*.so from an earlier build belongs to another torch or source."""
            if self.into_source:
                for stale in (ROOT / "apexlite").glob("_C.*"):
                    stale.unlink()

    return KernelBuild


@contextlib.contextmanager
def _stdout_to(path):
    """Sends this process's stdout (where torch's builder lets the compiler write) to `path` for the
    duration, then replays it, so the first compiler error can be quoted and pip -v still shows it all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(path, "wb") as sink:
            os.dup2(sink.fileno(), 1)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        sys.stdout.write(_read(path))
        sys.stdout.flush()


def _read(path):
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _include_dirs(with_cuda):
    dirs = [str(path) for path in plan.include_dirs(CSRC)]
    return dirs + (plan.cuda_include_dirs(plan.find_cuda_home()) if with_cuda else [])


def _relative(paths):
    return [str(path.relative_to(ROOT)) for path in paths]


def _cpu_extension(cpp_extension):
    return cpp_extension.CppExtension(
        "apexlite._C", _relative(plan.cpu_sources(CSRC)), include_dirs=_include_dirs(False),
        extra_compile_args={"cxx": list(plan.CXX_FLAGS)}, extra_link_args=list(plan.LINK_FLAGS), optional=True)


def _cuda_extension(torch, cpp_extension):
    if not torch.cuda.is_available():
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    return cpp_extension.CUDAExtension(
        "apexlite._C", _relative(plan.cpu_sources(CSRC) + plan.cuda_sources(CSRC)), include_dirs=_include_dirs(True),
        extra_compile_args={"cxx": list(plan.CXX_FLAGS), "nvcc": list(plan.NVCC_FLAGS)},
        extra_link_args=list(plan.LINK_FLAGS), optional=True)


def native_build():
    """(ext_modules, cmdclass, skipped): skipped is (torch version or None, why nothing is compiled), or None."""
    cmdclass = {"build_py": BuildPyWithKernelSources}
    if not plan.switch_on(plan.BUILD_ENV, default=True):
        return [], cmdclass, (None, f"{plan.BUILD_ENV}=0")
    try:
        import torch

        if torch.version.cuda and not os.environ.get("CUDA_HOME") and plan.find_cuda_home():
            # before torch's builder is imported: it would take nvcc's parent folder for the toolkit
            os.environ["CUDA_HOME"] = plan.find_cuda_home()
        from torch.utils import cpp_extension
    except ImportError:
        if plan.switch_on(plan.REQUIRE_ENV):
            raise SystemExit(f"apexlite: {plan.REQUIRE_ENV}=1 but torch is not importable by the build; install "
                             "torch first and use pip install --no-build-isolation")
        return [], cmdclass, (None, plan.cpu_obstacle(plan.Toolchain(None, None, None, False, False)))
    tools = plan.probe_toolchain(torch.__version__, torch.version.cuda)
    install = plan.install_plan(tools)
    if install.require and not install.cpu.build:
        raise SystemExit(f"apexlite: {plan.REQUIRE_ENV}=1 but the CPU library cannot be compiled: {install.cpu.why_not}")
    if install.require and plan.switch_on(plan.CUDA_ENV) and not install.cuda.build:
        raise SystemExit(f"apexlite: {plan.REQUIRE_ENV}=1 and {plan.CUDA_ENV}=1 but the CUDA kernel cannot be "
                         f"compiled: {install.cuda.why_not}")
    if not install.cpu.build:
        return [], cmdclass, (torch.__version__, install.cpu.why_not)
    ext = _cuda_extension(torch, cpp_extension) if install.cuda.build else _cpu_extension(cpp_extension)
    cmdclass["build_ext"] = _kernel_build_class(torch, cpp_extension, tools, install)
    return [ext], cmdclass, None


ext_modules, cmdclass, SKIPPED = native_build()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
