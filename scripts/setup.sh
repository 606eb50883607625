#!/usr/bin/env bash
# Install apexlite and its dependencies into the Python environment of $PYTHON (default: python3).
# torch is pinned to the CPU build that this machine keeps on local disk; users may use any torch>=2.5
# (docs/compatibility.md).
#
# A call with nothing changed since the last install returns at once. What was installed is recorded in
# a stamp per interpreter (build/install-stamps/): the interpreter and its prefix, this checkout, the
# installed versions of torch/wrapt/pytest/libcst/hypothesis/setuptools/wheel/apexlite and where apexlite
# is installed from, and a hash of what the install is built from (csrc/, setup.py, pyproject.toml, this
# script) and of the compiled extension apexlite/_C*.so itself. The install is editable, so edits to
# apexlite/*.py are live without a reinstall; anything else that changes makes the next call reinstall
# and rebuild.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

stamp() {
    "$PY" - <<'PYTHON'
import glob, hashlib, importlib.metadata as metadata, json, os, sys

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
sources = sorted(glob.glob("csrc/**/*", recursive=True)) + ["setup.py", "pyproject.toml", "scripts/setup.sh"]
for path in sources + sorted(glob.glob("apexlite/_C*.so")):
    if os.path.isfile(path):
        with open(path, "rb") as handle:
            digest.update(path.encode() + b"\0" + handle.read())
print(json.dumps({
    "python": sys.version, "executable": sys.executable, "prefix": sys.prefix, "checkout": os.getcwd(),
    "packages": {name: installed(name) for name in ("torch", "wrapt", "pytest", "hypothesis", "libcst",
                                                    "setuptools", "wheel", "apexlite")},
    "apexlite_installed_from": installed_from(), "sources": digest.hexdigest(),
}, sort_keys=True))
PYTHON
}

STAMP_DIR=build/install-stamps
STAMP_FILE=$STAMP_DIR/$("$PY" -c 'import hashlib, sys; print(hashlib.sha256(sys.prefix.encode()).hexdigest()[:16])').json
if [ -f "$STAMP_FILE" ] && [ "$(stamp)" = "$(cat "$STAMP_FILE")" ]; then
    echo "setup: nothing changed since the last install into $("$PY" -c 'import sys; print(sys.prefix)'); skipped" >&2
else
    # libcst: the `migrate` extra (apexlite[migrate]), pinned so its tests run the same everywhere;
    # hypothesis: the cast-path and migrate property tests.
    "$PY" -m pip install --quiet "torch==2.13.0" "wrapt>=1.14" "pytest>=7" "libcst==1.9.0" "hypothesis==6.170.15" \
        setuptools wheel
    # --no-build-isolation: build against the torch installed above, never download another one.
    "$PY" -m pip install --quiet --no-build-isolation --no-deps -e .
    mkdir -p "$STAMP_DIR"
    stamp > "$STAMP_FILE"
fi

# timm, transformers and accelerate (pyproject's test-libraries extra) for tests/libraries, in a venv of
# their own that sees this one's packages, so this venv stays without numpy. The script returns at once
# when the pinned versions are already there. APEXLITE_SKIP_TEST_LIBRARIES=1 leaves them out (those tests
# then skip, saying why).
if [ "${APEXLITE_SKIP_TEST_LIBRARIES:-0}" != 1 ]; then
    "$PY" scripts/install_test_libraries.py
fi
