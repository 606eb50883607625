"""apexlite.initialize_scan: what `check` tells from a script's amp.initialize calls before it runs.

Reference: the run itself. Each case is a small script; the scan's verdict (a row that raises, a row that
differs, or none) must agree with what apexlite's amp.initialize and step do when the script is executed.
"""
import ast

import pytest
import torch

from apexlite import amp, api_status, check
from apexlite.amp.errors import AmpConfigError, AmpUsageError

HEAD = ("import torch\nfrom apex import amp\nmodel = torch.nn.Linear(2, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n")
TRAIN = ("loss = model(torch.randn(3, 2)).sum()\nwith amp.scale_loss(loss, optimizer) as scaled:\n"
         "    scaled.backward()\n")

# (id, the script after HEAD, expected row kind or None, what running it raises or None)
CASES = [
    ("zero-for-letter-O", 'model, optimizer = amp.initialize(model, optimizer, opt_level="01")\n',
     api_status.RAISES, AmpConfigError),
    ("bad-keep-batchnorm", 'model, optimizer = amp.initialize(model, optimizer, opt_level="O2", '
                           'keep_batchnorm_fp32="yes")\n', api_status.RAISES, AmpConfigError),
    ("o1-keep-batchnorm", 'model, optimizer = amp.initialize(model, optimizer, opt_level="O1", '
                          'keep_batchnorm_fp32=True)\n', api_status.RAISES, AmpConfigError),
    ("positional-level", 'model, optimizer = amp.initialize(model, optimizer, True, "O4")\n',
     api_status.RAISES, AmpConfigError),
    ("bad-num-losses", 'model, optimizer = amp.initialize(model, optimizer, opt_level="O1", num_losses=0)\n',
     api_status.RAISES, AmpConfigError),
    ("tuple-of-models", '(model,), optimizer = amp.initialize((model,), optimizer, opt_level="O1")\n',
     api_status.RAISES, AmpUsageError),
    ("string-false-is-valid", 'model, optimizer = amp.initialize(model, optimizer, opt_level="O2", '
                              'keep_batchnorm_fp32="False", cast_model_type=torch.bfloat16)\n' + TRAIN +
     "optimizer.step()\n", None, None),
    ("level-from-a-variable", 'level = "O1"\nmodel, optimizer = amp.initialize(model, optimizer, opt_level=level)\n'
     + TRAIN + "optimizer.step()\n", None, None),
    ("o1-keep-batchnorm-from-a-constant", 'LEVEL = "O1"\nmodel, optimizer = amp.initialize(model, optimizer, '
                                          'opt_level=LEVEL, keep_batchnorm_fp32=True)\n', api_status.RAISES,
     AmpConfigError),
    ("o1-keep-batchnorm-from-an-argparse-default",
     'import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument("--opt-level", default="O1")\n'
     'args = parser.parse_args([])\nmodel, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level, '
     'keep_batchnorm_fp32=True)\n', api_status.RAISES, AmpConfigError),
    ("a-name-bound-twice-is-left-to-the-run", 'LEVEL = "O1"\nLEVEL = "O2"\nmodel, optimizer = amp.initialize('
                                              'model, optimizer, opt_level=LEVEL, keep_batchnorm_fp32=True, '
                                              'cast_model_type=torch.bfloat16)\n' + TRAIN + "optimizer.step()\n",
     None, None),
    ("step-with-closure", 'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n' + TRAIN +
     "optimizer.step(lambda: 0.0)\n", api_status.RAISES, AmpUsageError),
    ("o2-clip-of-model-params", 'model, optimizer = amp.initialize(model, optimizer, opt_level="O2", '
                                'cast_model_type=torch.bfloat16)\n' + TRAIN +
     "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\noptimizer.step()\n", api_status.DIFFERS, None),
    ("o2-clip-of-master-params", 'model, optimizer = amp.initialize(model, optimizer, opt_level="O2", '
                                 'cast_model_type=torch.bfloat16)\n' + TRAIN +
     "torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)\noptimizer.step()\n", None, None),
    ("half-model", 'model.half()\nmodel, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n',
     api_status.RAISES, AmpUsageError),
    ("half-model-by-to", 'model = model.to(torch.float16)\nmodel, optimizer = amp.initialize(model, optimizer, '
                         'opt_level="O2")\n', api_status.RAISES, AmpUsageError),
    ("bf16-model-in-a-list", 'other = torch.nn.Linear(2, 2).bfloat16()\nmodels, optimizer = amp.initialize('
                             '[model, other], optimizer, opt_level="O1")\n', api_status.RAISES, AmpUsageError),
    ("half-in-the-call", 'model, optimizer = amp.initialize(model.half(), optimizer, opt_level="O3")\n',
     api_status.RAISES, AmpUsageError),
    ("half-then-rebuilt", 'model.half()\nmodel = torch.nn.Linear(2, 2)\noptimizer = torch.optim.SGD('
                          'model.parameters(), lr=0.1)\nmodel, optimizer = amp.initialize(model, optimizer, '
                          'opt_level="O1")\n' + TRAIN + "optimizer.step()\n", None, None),
    ("half-in-another-function", 'def fp16_copy(model):\n    model.half()\n'
                                 'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n' + TRAIN +
     "optimizer.step()\n", None, None),
    ("half-under-a-branch-not-taken", 'fp16 = False\nif fp16:\n    model.half()\nmodel, optimizer = '
                                      'amp.initialize(model, optimizer, opt_level="O1")\n' + TRAIN +
     "optimizer.step()\n", api_status.DIFFERS, None),
    ("half-under-a-branch-taken", 'fp16 = True\nif fp16:\n    model.half()\nmodel, optimizer = '
                                  'amp.initialize(model, optimizer, opt_level="O1")\n', api_status.DIFFERS,
     AmpUsageError),
    ("half-and-initialize-under-one-branch", 'if True:\n    model.half()\n    model, optimizer = '
                                             'amp.initialize(model, optimizer, opt_level="O1")\n',
     api_status.RAISES, AmpUsageError),
    ("fp16-optimizer", 'from apex.fp16_utils import FP16_Optimizer\noptimizer = FP16_Optimizer(optimizer, '
                       'static_loss_scale=128.0)\nmodel, optimizer = amp.initialize(model, optimizer, '
                       'opt_level="O1")\n', api_status.RAISES, AmpUsageError),
    ("enabled-not-a-flag", 'model, optimizer = amp.initialize(model, optimizer, opt_level="O2", enabled="no")\n',
     api_status.RAISES, AmpConfigError),
    ("enabled-string-false", 'model, optimizer = amp.initialize(model, optimizer, opt_level="O4", enabled="False")\n',
     None, None),
]
NEW_ROWS = ("apex.amp.initialize(...)", "optimizer.step(closure)", "clip of model.parameters() at O2")


def _new_rows(source):
    return [row for row in check.scan(ast.parse(source)) if row[0] in NEW_ROWS]


@pytest.mark.parametrize("body, kind, raised", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_the_scan_agrees_with_the_run(body, kind, raised):
    source = HEAD + body
    rows = _new_rows(source)
    assert [row[2].split(":", 1)[0] for row in rows] == ([kind] if kind else [])
    namespace = {}
    runnable = source.replace("from apex import amp\n", "").replace("from apex.", "from apexlite.compat.apex.")
    try:
        if raised is None:
            exec(compile(runnable, "<case>", "exec"), dict(namespace, amp=amp))
        else:
            with pytest.raises(raised):
                exec(compile(runnable, "<case>", "exec"), dict(namespace, amp=amp))
    finally:
        amp.deinitialize()


def test_a_raising_call_fails_checks_exit_status_and_names_its_line(tmp_path, capsys):
    script = tmp_path / "zero.py"
    script.write_text(HEAD + CASES[0][1])
    assert check.main([str(script)]) == 1
    out = capsys.readouterr().out
    assert "apex.amp.initialize(...)  line 5: raises: amp.initialize raises here: " in out
    assert "letter O, not the number zero" in out and "1 raise when they run as written" in out
    assert torch.nn.functional.linear is torch._C._nn.linear  # reading a script patches nothing


def test_a_refusal_that_rests_on_an_argparse_default_says_so():
    """The run may pass another --opt-level: the row names the default it judged."""
    source = HEAD + CASES[[case[0] for case in CASES].index("o1-keep-batchnorm-from-an-argparse-default")][1]
    (row,) = _new_rows(source)
    assert "with the script's defaults (--opt-level 'O1')" in row[2]
