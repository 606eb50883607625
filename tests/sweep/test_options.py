"""sweep.options: the command line is checked before any run starts, and --help documents every option."""
import pytest

from apexlite.sweep import options


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("pass\n")
    return str(path)


def test_script_arguments_go_after_the_double_dash(script):
    args = options.parse_args([script, "--opt-levels", "O1,O2", "--", "--epochs", "1", "--opt-levels", "x"])
    assert args.opt_levels == ["O1", "O2"] and args.script_args == ["--epochs", "1", "--opt-levels", "x"]


@pytest.mark.parametrize("given,expected", [("fp16", ["float16"]), ("half,bf16", ["float16", "bfloat16"]),
                                            ("BF16,bfloat16,float16", ["bfloat16", "float16"])])
def test_dtype_aliases_are_those_apexlite_dtype_accepts(script, given, expected):
    assert options.parse_args([script, "--dtypes", given]).dtypes == expected


BAD_OPTIONS = [
    (["--opt-levels", "01"], "letter O, not zero"),
    (["--dtypes", "float8"], "not among"),
    (["--timeout", "0"], "--timeout: must be a finite number > 0"),
    (["--timeout", "inf"], "--timeout: must be a finite number > 0"),
    (["--budget", "0"], "--budget: must be a finite number > 0"),
    (["--precision", "-0.1"], "--precision: must be a finite number > 0"),
    (["--max-steps", "0"], "--max-steps: must be a whole number >= 1"),
    (["--max-steps", "2"], "leaves no timed step after --warmup 3"),
    (["--warmup", "-1"], "--warmup: must be a whole number >= 0"),
    (["--repeats", "0"], "--repeats: must be a whole number >= 1"),
    (["--tolerance", "-0.1"], "--tolerance: must be a finite number >= 0"),
    (["--json", "/no/such/dir/runs.json"], "does not exist or is not writable"),
    (["--plot", "curves.gif"], "must end in one of .png, .pdf, .svg"),
    (["--epochs", "3"], "arguments for the script go after `--`"),
]


@pytest.mark.parametrize("extra,message", BAD_OPTIONS, ids=[" ".join(case[0]) for case in BAD_OPTIONS])
def test_bad_options_stop_before_any_run_with_the_reason(script, capsys, extra, message):
    with pytest.raises(SystemExit) as stop:
        options.parse_args([script, *extra])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_script_is_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        options.parse_args([str(tmp_path / "nope.py")])
    assert "no such script" in capsys.readouterr().err


def test_a_folder_is_a_script_when_python_would_run_it(tmp_path, capsys):
    """As `python DIR` and `apexlite run DIR`: a folder with a __main__.py runs; one without is named as such."""
    with pytest.raises(SystemExit) as stop:
        options.parse_args([str(tmp_path)])
    assert stop.value.code == 2
    assert f"{tmp_path} is a folder without a __main__.py: name the script to run" in capsys.readouterr().err
    (tmp_path / "__main__.py").write_text("")
    assert options.parse_args([str(tmp_path)]).script == str(tmp_path)


def test_help_documents_every_option_with_its_default_and_the_double_dash(capsys):
    parser = options._build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.option_strings[0] in text
            assert "default" in action.help or action.default is None, action.dest
    assert "-- SCRIPT_ARGS" in text and "sweep train.py --max-steps 20 -- --epochs 90" in text
    assert "APEXLITE_MAX_STEPS=20 python -m apexlite run train.py" in text
    assert "no measurable difference" in text and "speed could not be measured" in text


def test_o0_runs_once_labelled_float32():
    pairs = options.combinations(["O0", "O1"], ["float16", "bfloat16"])
    assert pairs == [("O0", "float32"), ("O1", "float16"), ("O1", "bfloat16")]
