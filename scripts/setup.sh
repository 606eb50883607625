#!/usr/bin/env bash
# Install apexlite and what it needs into one Python environment: `bash scripts/setup.sh [main|test]`.
#   main  what the README's commands need (scripts/requirements-main.txt: torch, pinned to the CPU build
#         this machine keeps on local disk, users may use any torch >= 2.5, docs/compatibility.md; wrapt,
#         ninja, numpy, libcst), then apexlite itself, editable, with its kernels compiled against that
#         torch (the estimate, the steps done and what was not built are shown as they happen);
#   test  (the default) also the test tools (scripts/requirements-test.txt: pytest, pytest-xdist, hypothesis), and
#         unless APEXLITE_SKIP_TEST_LIBRARIES=1 the real libraries tests/libraries runs (timm,
#         transformers, accelerate), in a venv of their own (scripts/install_test_libraries.py).
# The environment: $PYTHON when set, else this checkout's ./.venv, created on first use (python_env.sh).
#
# A call with nothing changed since the last install returns at once. What was installed is recorded in
# a stamp per interpreter (build/install-stamps/): the interpreter and its prefix, this checkout, the
# installed versions of requirements-main.txt's packages and apexlite and where apexlite is installed
# from, and a hash of what the install is built from (csrc/, setup.py, apexlite/_native/build_plan.py,
# pyproject.toml, this script and requirements-main.txt) and of the compiled extension apexlite/_C*.so
# itself. The install is editable, so edits to apexlite/*.py are live without a reinstall; anything else
# that changes makes the next call reinstall and recompile. pip's full output of the last install is in
# build/install-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-test}
case "$PROFILE" in main|test) ;; *) echo "usage: bash scripts/setup.sh [main|test]" >&2; exit 2 ;; esac
source scripts/python_env.sh
PY=$PYTHON

stamp() {
    "$PY" - <<'PYTHON'
import glob, hashlib, importlib.metadata as metadata, json, os, re, sys

def installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

def installed_from():
    try:
        return metadata.distribution("apexlite").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None

digest = hashlib.sha256()
sources = sorted(glob.glob("csrc/**/*", recursive=True)) + [
    "setup.py", "apexlite/_native/build_plan.py", "pyproject.toml", "scripts/setup.sh",
    "scripts/requirements-main.txt"]
with open("scripts/requirements-main.txt") as requirements:
    names = [re.split(r"[<>=!~;\[ ]", line.split("#")[0].strip())[0] for line in requirements]
names = [name for name in names if name] + ["apexlite"]
for path in sources + sorted(glob.glob("apexlite/_C*.so")):
    if os.path.isfile(path):
        with open(path, "rb") as handle:
            digest.update(path.encode() + b"\0" + handle.read())
print(json.dumps({
    "python": sys.version, "executable": sys.executable, "prefix": sys.prefix, "checkout": os.getcwd(),
    "packages": {name: installed(name) for name in names},
    "apexlite_installed_from": installed_from(), "sources": digest.hexdigest(),
}, sort_keys=True))
PYTHON
}

PREFIX_KEY=$("$PY" -c 'import hashlib, sys; print(hashlib.sha256(sys.prefix.encode()).hexdigest()[:16])')
STAMP_FILE=build/install-stamps/$PREFIX_KEY.json
if [ -f "$STAMP_FILE" ] && [ "$(stamp)" = "$(cat "$STAMP_FILE")" ]; then
    echo "setup: nothing changed since the last install into $("$PY" -c 'import sys; print(sys.prefix)'); skipped" >&2
else
    "$PY" -m pip install --quiet -r scripts/requirements-main.txt
    # --no-build-isolation: compile against the torch installed above, never a downloaded one. -v: so that
    # setup.py's own lines ("apexlite: compiling ...", what was not built) reach the screen as they happen;
    # the rest of pip's output goes to the log.
    mkdir -p build/install-logs
    LOG=build/install-logs/$PREFIX_KEY.log
    if ! "$PY" -m pip install -v --no-build-isolation --no-deps -e . 2>&1 | tee "$LOG" \
            | sed -un 's/^[[:space:]]*\(apexlite: \)/\1/p'; then
        tail -n 40 "$LOG" >&2
        echo "setup: installing apexlite failed (full output: $LOG)" >&2
        exit 1
    fi
    mkdir -p "$(dirname "$STAMP_FILE")"
    stamp > "$STAMP_FILE"
fi

[ "$PROFILE" = main ] && exit 0
# The test tools: pip returns in a second or two when the pins are already there.
"$PY" -m pip install --quiet -r scripts/requirements-test.txt
# timm, transformers and accelerate (pyproject's test-libraries extra) for tests/libraries, in a venv of
# their own that sees this one's packages, so this venv stays without them. The script returns at once
# when the pinned versions are already there. APEXLITE_SKIP_TEST_LIBRARIES=1 leaves them out (those tests
# then skip, saying why).
if [ "${APEXLITE_SKIP_TEST_LIBRARIES:-0}" != 1 ]; then
    "$PY" scripts/install_test_libraries.py
fi
