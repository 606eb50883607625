"""Measure apexlite on several torch versions and write docs/compatibility.md from the runs.

Each `--venv PATH` is a virtual environment with one torch installed (create it with `--torch VERSION`
and the script installs that torch and the test requirements with pip). For each, in a fresh copy of
this checkout (so the editable install's compiled extension of one torch never replaces another's):
  1. install:  pip install --no-build-isolation -e .          (the README's install command)
  2. native:   does apexlite._C import, and which paths do FusedAdam and O1's casts take
  3. doctor:   python -m apexlite doctor                      (its wall time)
  4. example:  python -m apexlite run examples/imagenet_amp.py at O1 and O2, in fp16 and bf16
  5. suite:    python -m pytest (native path, where the O1 tests run both cast paths through the
               `cast_path` fixture), then again with APEXLITE_DISABLE_EXTENSION=1 (everything pure
               Python); `--suite-args` narrows both runs, `--suite-paths` picks them
  6. plain install: pip install <copy> (not editable, pip's build isolation: what installing from an
               index does, so nothing is compiled), then a first FusedAdam step and an O1 forward from
               outside the tree with an empty TORCH_EXTENSIONS_DIR: the kernels are compiled on first
               use; records which paths ran and whether anything printed "failed". It replaces step 1's
               editable install, so it runs last; `--plain-only` adds it to an existing record.
Results go to docs/compat_runs/torch-<version>.json (kept: they are the evidence), one file per torch, so
versions can be measured one at a time; the table between the markers in docs/compatibility.md is
rendered from every result file there, and the prose around it is left as written.

    python scripts/compat_matrix.py --venv /tmp/venv-2.5 --torch 2.5.1
    python scripts/compat_matrix.py --render-only
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "compat_runs"
DOC = ROOT / "docs" / "compatibility.md"
TEST_REQUIREMENTS = ["wrapt>=1.14", "pytest>=7", "hypothesis==6.170.15", "libcst==1.9.0", "setuptools>=77", "wheel"]
EXAMPLE = ["-m", "apexlite", "run", "examples/imagenet_amp.py", "--epochs", "1", "--steps-per-epoch", "5"]
EXAMPLE_CASES = [(level, dtype) for level in ("O1", "O2") for dtype in ("float16", "bfloat16")]
FIRST_USE = (
    "import torch\n"
    "from apexlite import amp\nfrom apexlite._native import loader\n"
    "from apexlite.amp.o1 import native_casts\n"
    "from apexlite.optimizers import FusedAdam, _adam_step\n"
    "p = torch.nn.Parameter(torch.randn(1000))\n"
    "optimizer = FusedAdam([p], lr=0.01)\n"
    "for _ in range(3):\n"
    "    p.grad = torch.randn(1000)\n"
    "    optimizer.step()\n"
    "model = amp.initialize(torch.nn.Linear(4, 4), opt_level='O1', dtype=torch.bfloat16, verbosity=0)\n"
    "print('FIRST-USE', loader.status().source, _adam_step.resolve('auto', p.device), native_casts.status())\n"
)
TORCH_NUMPY_NOTE = "ignore:Failed to initialize NumPy"
START, END = "<!-- compat_matrix.py: start -->", "<!-- compat_matrix.py: end -->"
COPY_IGNORE = shutil.ignore_patterns(".git", "build", ".venv*", "out", "*.so", "__pycache__", "*.egg-info",
                                     ".pytest_cache")


def run(command: List[str], cwd: Path, env: Dict[str, str], timeout: float) -> dict:
    """Run one step; its command, exit status, wall time and the tail of its output."""
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        status, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as expired:
        status, output = "timeout", (expired.stdout or b"").decode(errors="replace") if isinstance(
            expired.stdout, bytes) else (expired.stdout or "")
    lines = [line for line in output.splitlines() if line.strip() and "is ignored: it is neither" not in line]
    return {"command": " ".join(command), "status": status, "seconds": round(time.monotonic() - start, 1),
            "tail": lines[-25:]}


def interpreter_facts(python: str) -> dict:
    code = ("import json, platform, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,"
            " 'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,"
            " 'python': platform.python_version()}))")
    return json.loads(subprocess.check_output([python, "-c", code], text=True, stderr=subprocess.DEVNULL))


def example_summary(step: dict) -> str:
    """The example's last loss line, or the line that says why it stopped."""
    losses = [line.split(" time ")[0] for line in step["tail"] if re.search(r"\bloss [0-9.]+", line)]
    if step["status"] == 0 and losses:
        return f"ok ({losses[-1]})"
    errors = [line for line in step["tail"] if "Error" in line or "error" in line]
    return f"exit {step['status']}: {(errors or step['tail'] or ['no output'])[-1].strip()}"


def pytest_summary(step: dict) -> str:
    for line in reversed(step["tail"]):
        if re.search(r"\d+ (passed|failed|error)", line):
            return line.strip("= ").strip()
    return f"exit {step['status']}: {(step['tail'] or ['no output'])[-1]}"


def create_venv(venv: Path, torch_spec: str) -> None:
    subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
    subprocess.check_call([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"torch=={torch_spec}",
                           *TEST_REQUIREMENTS])


def measure(venv: Path, extra_env: Dict[str, str], suite_args: List[str], suite_paths: List[str],
            timeout: float) -> dict:
    python = str(venv / "bin" / "python")
    facts = interpreter_facts(python)
    env = dict(os.environ, **extra_env)
    env.pop("APEXLITE_DISABLE_EXTENSION", None)
    result = {"facts": facts, "env": extra_env, "steps": {}}
    with tempfile.TemporaryDirectory(prefix="apexlite-compat-") as scratch:
        tree = Path(scratch) / "apexlite"
        shutil.copytree(ROOT, tree, ignore=COPY_IGNORE)
        steps = result["steps"]
        steps["install"] = run([python, "-m", "pip", "install", "--no-build-isolation", "-e", "."], tree, env, timeout)
        native = ("import apexlite._C as c; from apexlite.amp.o1 import native_casts; "
                  "print('O1 casts:', native_casts.status()); print('CastWrapper:', hasattr(c, 'CastWrapper'))")
        steps["native"] = run([python, "-c", native], tree, env, timeout)
        steps["doctor"] = run([python, "-m", "apexlite", "doctor"], tree, env, timeout)
        for level, dtype in EXAMPLE_CASES:
            steps[f"example {level} {dtype}"] = run([python, *EXAMPLE, "--opt-level", level], tree,
                                                    dict(env, APEXLITE_DTYPE=dtype), timeout)
        pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(suite_args or [])]
        if "native" in suite_paths:
            steps["suite native"] = run(pytest, tree, env, timeout)
        if "python" in suite_paths:
            steps["suite python"] = run(pytest, tree, dict(env, APEXLITE_DISABLE_EXTENSION="1"), timeout)
        steps.update(measure_plain(python, env, timeout))
    return result


def measure_plain(python: str, env: Dict[str, str], timeout: float) -> Dict[str, dict]:
    """Step 6: a plain (non-editable, build-isolated) install of a fresh copy, and its first use."""
    with tempfile.TemporaryDirectory(prefix="apexlite-plain-") as scratch:
        tree = Path(scratch) / "apexlite"
        shutil.copytree(ROOT, tree, ignore=COPY_IGNORE)
        steps = {"plain install": run([python, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(tree)],
                                      Path(scratch), env, timeout)}
        first_env = dict(env, TORCH_EXTENSIONS_DIR=str(Path(scratch) / "extensions"),
                         PYTHONWARNINGS=TORCH_NUMPY_NOTE)  # torch's own note about a venv without numpy
        steps["first use"] = run([python, "-c", FIRST_USE], Path(scratch), first_env, timeout)
    return steps


def cell(result: dict, name: str) -> str:
    step = result["steps"].get(name)
    if step is None:
        return "not run"
    if name.startswith("example"):
        return example_summary(step)
    if name.startswith("suite"):
        return f"{pytest_summary(step)} ({step['seconds'] / 60:.0f} min)"
    if name == "plain install":
        said = "failed" in " ".join(step["tail"]).lower()
        return f"exit {step['status']} in {step['seconds']:.0f} s; 'failed' printed: {'yes' if said else 'no'}"
    if name == "first use":
        said = "failed" in " ".join(step["tail"]).lower()
        paths = [line.split()[1:] for line in step["tail"] if line.startswith("FIRST-USE")]
        if step["status"] != 0 or not paths:
            return f"exit {step['status']}: {(step['tail'] or ['no output'])[-1]}"
        source, adam, casts = paths[-1]
        return (f"exit 0 in {step['seconds']:.0f} s: CPU library {source}, FusedAdam {adam}, O1 casts {casts}; "
                f"'failed' printed: {'yes' if said else 'no'}")
    if name == "native":
        lines = [line for line in step["tail"] if line.startswith(("O1 casts", "CastWrapper"))]
        return "built: " + "; ".join(lines) if step["status"] == 0 else f"not built: {step['tail'][-1:]}"
    if name == "doctor":
        rows = [line for line in step["tail"] if line.startswith(("FusedAdam on CPU", "O1 casts"))]
        return f"exit {step['status']} in {step['seconds']:.0f} s" + (": " + "; ".join(
            " ".join(row.split()) for row in rows) if rows else "")
    return f"exit {step['status']} in {step['seconds']:.0f} s"


def render(results: List[dict]) -> str:
    """The table and the record of how it was measured (what goes between the markers)."""
    results = sorted(results, key=lambda r: [int(p) for p in re.findall(r"\d+", r["facts"]["torch"])[:3]])
    names = ["install", "native", "doctor"] + [f"example {l} {d}" for l, d in EXAMPLE_CASES] + [
        "suite native", "suite python", "plain install", "first use"]
    lines = ["| step | " + " | ".join(f"torch {r['facts']['torch']}" for r in results) + " |",
             "|" + " --- |" * (len(results) + 1)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(cell(r, name).replace("|", "/") for r in results) + " |")
    lines.append("")
    for r in results:
        facts = r["facts"]
        env = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "nothing extra"
        lines.append(f"- torch {facts['torch']} (CUDA {facts['cuda'] or 'none'}, GPU: {facts['gpu'] or 'none'}), "
                     f"Python {facts['python']}: measured {r['date']} on {r['machine']}; environment: {env}.")
    lines += ["", "Commands (run in a fresh copy of the checkout, `python` being the venv's interpreter):", ""]
    for name, step in (results[-1]["steps"].items() if results else []):
        command = re.sub(r"^\S*python\S*", "python", step["command"])
        if name.startswith("example"):
            command = f"APEXLITE_DTYPE={name.split()[-1]} {command}"
        elif name == "suite python":
            command = f"APEXLITE_DISABLE_EXTENSION=1 {command}"
        elif name == "plain install":
            command = "python -m pip install --no-deps --force-reinstall COPY  (from outside the copy)"
        elif name == "first use":
            command = "TORCH_EXTENSIONS_DIR=<empty> python -c FIRST_USE  (scripts/compat_matrix.py)"
        lines.append(f"- {name}: `{command}`")
    return "\n".join(lines)


def write_doc(results: List[dict]) -> None:
    """Replace what lies between the markers of docs/compatibility.md with the rendered table."""
    text = DOC.read_text()
    if START not in text or END not in text:
        raise ValueError(f"{DOC} lacks the lines {START} and {END} that enclose the table")
    start, end = text.index(START) + len(START), text.index(END)
    DOC.write_text(text[:start] + "\n" + render(results) + "\n" + text[end:])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", action="append", default=[], type=Path, help="a venv with one torch installed")
    parser.add_argument("--torch", action="append", default=[],
                        help="with --venv (same order): create that venv with this torch first if it is missing")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE set for every step (recorded)")
    parser.add_argument("--suite-args", default="", help="arguments for both pytest runs (default: the whole suite)")
    parser.add_argument("--suite-paths", default="native,python",
                        help="comma-separated suite runs: native (as installed), python "
                             "(APEXLITE_DISABLE_EXTENSION=1); 'none' runs neither (default: native,python)")
    parser.add_argument("--timeout", type=float, default=3 * 3600, help="seconds per step")
    parser.add_argument("--plain-only", action="store_true",
                        help="only step 6, added to the venv's torch's existing record")
    parser.add_argument("--render-only", action="store_true", help="rewrite the table from docs/compat_runs/*.json")
    args = parser.parse_args(argv)
    extra_env = dict(item.split("=", 1) for item in args.env)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for index, venv in enumerate([] if args.render_only else args.venv):
        if not (venv / "bin" / "python").exists():
            if index >= len(args.torch):
                parser.error(f"{venv} has no bin/python; give --torch VERSION to create it")
            create_venv(venv, args.torch[index])
        if args.plain_only:
            python = str(venv / "bin" / "python")
            out = RESULTS / f"torch-{interpreter_facts(python)['torch']}.json"
            result = json.loads(out.read_text())
            result["steps"].update(measure_plain(python, dict(os.environ, **extra_env), args.timeout))
            result["plain_date"] = datetime.date.today().isoformat()
            out.write_text(json.dumps(result, indent=1) + "\n")
            print(f"compat: plain install of torch {result['facts']['torch']} -> {out}")
            continue
        result = measure(venv, extra_env, args.suite_args.split(), args.suite_paths.split(","), args.timeout)
        result["date"] = datetime.date.today().isoformat()
        result["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform(terse=True)}"
        out = RESULTS / f"torch-{result['facts']['torch']}.json"
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"compat: torch {result['facts']['torch']} -> {out}")
    results = [json.loads(path.read_text()) for path in sorted(RESULTS.glob("torch-*.json"))]
    write_doc(results)
    print(f"compat: wrote {DOC} from {len(results)} torch version(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
