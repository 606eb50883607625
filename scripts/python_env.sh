# Sourced by setup.sh, test.sh and run_main.sh (from the checkout's root): sets and exports PYTHON, the
# interpreter they install into and run. $PYTHON when set (CI sets it); otherwise this checkout's own
# venv ./.venv, created here on first use, so nothing is ever installed into the system's python3.
if [ -z "${PYTHON:-}" ]; then
    PYTHON=$PWD/.venv/bin/python
    if [ ! -x "$PYTHON" ]; then
        echo "setup: PYTHON is not set; creating this checkout's venv ./.venv (python3 -m venv) to install into" >&2
        python3 -m venv .venv || {
            echo "setup: python3 -m venv failed; install your distribution's python3-venv, or set PYTHON" >&2
            exit 1
        }
    else
        echo "setup: PYTHON is not set; using this checkout's venv ./.venv" >&2
    fi
fi
export PYTHON
