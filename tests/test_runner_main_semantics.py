"""`python -m apexlite run` against plain `python`: the same probe prints the same things under both.

The probe reports what a script can see of how it was started (sys.argv[0], __file__, sys.path[0], the
__main__ spec, loader and package, the file names in its code and stack), then changes directory and
reads a file beside itself, then may raise: the output and the traceback must match plain python's.
"""
import os
import signal
import subprocess
import sys
import textwrap
import zipfile

import pytest

TIMEOUT_S = 90

PROBE = textwrap.dedent('''
    """probe docstring"""
    import inspect, json, os, sys, traceback


    def where():
        return traceback.extract_stack()[-1].filename


    loader = globals().get("__loader__")
    spec = __spec__
    seen = {
        "name": __name__, "doc": __doc__, "argv0": sys.argv[0], "argv": sys.argv[1:], "file": __file__,
        "path0": sys.path[0], "package": __package__, "cached": globals().get("__cached__"),
        "spec": None if spec is None else [spec.name, spec.origin, spec.parent, type(spec.loader).__name__],
        "loader": None if loader is None else [type(loader).__name__, getattr(loader, "name", None)],
        "main_is_this_module": sys.modules["__main__"].__dict__ is globals(),
        "code_file": where.__code__.co_filename, "stack_file": where(), "inspect_file": inspect.getfile(where),
    }
    here = os.path.dirname(__file__)
    os.chdir("/")
    seen["beside_after_chdir"] = open(os.path.join(here, "beside.txt")).read() if os.path.isdir(here) else None
    print(json.dumps(seen, sort_keys=True))
    if "raise" in sys.argv or "interrupt" in sys.argv:
        def inner():
            if "interrupt" in sys.argv:
                raise KeyboardInterrupt
            raise ValueError("boom from the probe")
        inner()
''')


def _env():
    return {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}


def _both(args, cwd):
    """(plain python, apexlite run) results of the same command line, from the same folder."""
    plain = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd,
                           env=_env())
    under_run = subprocess.run([sys.executable, "-m", "apexlite", "run", *args], capture_output=True, text=True,
                               timeout=TIMEOUT_S, cwd=cwd, env=_env())
    return plain, under_run


def _traceback(stderr):
    """The traceback from its header on (torch may warn at import before it), without the frames of the
    interpreter's own runpy, which `python` shows for -m, folders and zips and `apexlite run` cannot."""
    lines = stderr.splitlines()
    return [line for line in lines[lines.index("Traceback (most recent call last):"):]
            if not line.startswith('  File "<frozen runpy>"')]


@pytest.fixture
def layout(tmp_path):
    """A probe script, a symlink to it from another folder, a package module, a folder and a zip archive
    with a __main__.py, each with a beside.txt next to it."""
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "beside.txt").write_text("next to the probe")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "linked_probe.py").symlink_to(tmp_path / "probe.py")
    (tmp_path / "links" / "beside.txt").write_text("next to the link")
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(PROBE)
    (package / "beside.txt").write_text("next to the module")
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text(PROBE)
    (app / "beside.txt").write_text("next to the folder's main")
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.writestr("__main__.py", PROBE)
    return tmp_path


CASES = [
    ("relative script", ["probe.py", "a", "--flag"]),
    ("script in a subfolder", ["./links/../probe.py"]),
    ("symlinked script", ["links/linked_probe.py"]),
    ("module with -m", ["-m", "pkg.train", "x"]),
    ("folder with __main__.py", ["app"]),
    ("folder given through ..", ["./app/../app"]),
    ("zip archive", ["app.zip", "y"]),
]


@pytest.mark.parametrize("name,args", CASES, ids=[case[0] for case in CASES])
def test_run_shows_the_script_what_python_shows_it(layout, name, args):
    plain, under_run = _both(args, layout)
    assert plain.returncode == 0, plain.stderr
    assert under_run.returncode == 0, under_run.stderr
    assert under_run.stdout == plain.stdout


@pytest.mark.parametrize("name,args", CASES, ids=[case[0] for case in CASES])
def test_tracebacks_name_the_same_files_and_lines(layout, name, args):
    plain, under_run = _both([*args, "raise"], layout)
    assert plain.returncode == under_run.returncode == 1
    expected = _traceback(plain.stderr)
    assert _traceback(under_run.stderr) == expected
    assert expected[-1] == "ValueError: boom from the probe"
    assert sum(line.startswith('  File "') for line in expected) == 2  # <module> and inner, nothing of apexlite


@pytest.mark.parametrize("name,args", CASES[:1] + CASES[3:4], ids=[CASES[0][0], CASES[3][0]])
def test_an_interrupt_is_shown_as_python_shows_it(layout, name, args):
    """Ctrl-C in the script: python's traceback, none of apexlite's frames; python ends itself by SIGINT,
    which a shell shows as status 130, the status run exits with."""
    plain, under_run = _both([*args, "interrupt"], layout)
    assert plain.returncode == -signal.SIGINT and under_run.returncode == 128 + signal.SIGINT
    expected = _traceback(plain.stderr)
    assert _traceback(under_run.stderr) == expected
    assert expected[-1] == "KeyboardInterrupt" and sum(line.startswith('  File "') for line in expected) == 2


def test_a_syntax_error_is_shown_as_python_shows_it(tmp_path):
    (tmp_path / "broken.py").write_text("x = 1\ndef broken(:\n    pass\n")
    plain, under_run = _both(["broken.py"], tmp_path)
    assert plain.returncode == under_run.returncode == 1
    expected = plain.stderr.splitlines()
    assert expected[0] == f'  File "{tmp_path / "broken.py"}", line 2' and expected[-1].startswith("SyntaxError")
    assert under_run.stderr.splitlines()[-len(expected):] == expected
    assert "Traceback" not in under_run.stderr


def test_a_folder_without_main_is_refused_like_python(tmp_path):
    (tmp_path / "empty").mkdir()
    plain, under_run = _both(["empty"], tmp_path)
    assert plain.returncode == under_run.returncode == 1
    assert f"can't find '__main__' module in {str(tmp_path / 'empty')!r}" in plain.stderr
    assert f"can't find '__main__' module in {str(tmp_path / 'empty')!r}" in under_run.stderr


SOURCE_PROBE = textwrap.dedent('''
    import json, sys, traceback
    loader = globals().get("__loader__")
    print(json.dumps({"name": __name__, "cached": globals().get("__cached__", "absent"), "argv": sys.argv, "path0": sys.path[0], "file": globals().get("__file__"),
                      "names": sorted(globals()),
                      "spec": __spec__ is None, "package": __package__, "doc": __doc__,
                      "loader": getattr(loader, "__name__", type(loader).__name__),
                      "code_file": traceback.extract_stack()[-1].filename,
                      "main_is_this_module": sys.modules["__main__"].__dict__ is globals()}, sort_keys=True))
    if "raise" in sys.argv:
        raise ValueError("boom from the source probe")
''')


@pytest.mark.parametrize("argv_tail", [[], ["raise"]], ids=["runs", "raises"])
@pytest.mark.parametrize("form", ["-c", "-"])
def test_code_given_with_dash_c_or_on_stdin_runs_as_python_runs_it(tmp_path, form, argv_tail):
    """`run -c CODE ARGS` and `run - ARGS` (the script on stdin), as `python -c` / `python -`: argv[0] is the flag,
    sys.path[0] is '', no __file__, tracebacks name <string> / <stdin>; and apex imports resolve to apexlite."""
    args = ["-c", SOURCE_PROBE, *argv_tail] if form == "-c" else ["-", *argv_tail]
    stdin = SOURCE_PROBE if form == "-" else None
    runs = [subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path,
                           env=_env())
            for command in ([sys.executable, *args], [sys.executable, "-m", "apexlite", "run", *args])]
    plain, under_run = runs
    assert under_run.returncode == plain.returncode == (1 if argv_tail else 0)
    assert under_run.stdout == plain.stdout
    if argv_tail:
        assert _traceback(under_run.stderr) == _traceback(plain.stderr)
    with_apex = subprocess.run([sys.executable, "-m", "apexlite", "run", "-c", "from apex import amp; print(amp.__name__)"],
                               capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path, env=_env())
    assert with_apex.stdout.strip() == "apexlite.compat.apex.amp"
