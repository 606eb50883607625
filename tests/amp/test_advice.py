"""amp.advice: a trap is reported exactly for the configurations that really train into NaN."""
import math

import pytest
import torch

from apexlite import amp
from apexlite.amp.advice import MIN_FP16_EPS, find_known_traps, warn_known_traps
from apexlite.amp.session import current_session

TRAPPED_OPTIMIZERS = ("Adam", "AdamW", "NAdam", "RAdam", "RMSprop")

# (name, opt level, dtype, optimizer, optimizer kwargs, initialize overrides)
TRAPS = [(f"O3 fp16 {name}", "O3", torch.float16, name, {}, {}) for name in TRAPPED_OPTIMIZERS] + [
    ("O2 fp16 Adam without masters", "O2", torch.float16, "Adam", {}, {"master_weights": False})]
SAFE = [
    ("O3 fp16 Adam eps=1e-4", "O3", torch.float16, "Adam", {"eps": MIN_FP16_EPS}, {}),
    ("O3 fp16 RMSprop eps=1e-4", "O3", torch.float16, "RMSprop", {"eps": MIN_FP16_EPS}, {}),
    ("O3 bf16 Adam", "O3", torch.bfloat16, "Adam", {}, {}),
    ("O3 bf16 RMSprop", "O3", torch.bfloat16, "RMSprop", {}, {}),
    ("O2 fp16 Adam", "O2", torch.float16, "Adam", {}, {}),
    ("O2 fp16 NAdam", "O2", torch.float16, "NAdam", {}, {}),
    ("O3 fp16 Adam with fp32 masters", "O3", torch.float16, "Adam", {}, {"master_weights": True}),
    ("O3 fp16 SGD", "O3", torch.float16, "SGD", {"momentum": 0.9}, {}),
    ("O1 fp16 Adam", "O1", torch.float16, "Adam", {}, {}),
]
STEPS = 20


def _train(level, dtype, optimizer_name, optimizer_kwargs, overrides):
    """20 Adam-style steps on a small regression; returns (losses, the traps found for the session)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = getattr(torch.optim, optimizer_name)(model.parameters(), lr=1e-3, **optimizer_kwargs)
    model, optimizer = amp.initialize(model, optimizer, opt_level=level, dtype=dtype, verbosity=0, **overrides)
    try:
        session = current_session()
        traps = find_known_traps(session.properties, [optimizer], session.dtype)
        x, y = torch.randn(64, 16), torch.randn(64, 1)
        losses = []
        for _ in range(STEPS):
            loss = torch.nn.functional.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses, traps
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("name,level,dtype,optimizer,kwargs,overrides", TRAPS, ids=[case[0] for case in TRAPS])
def test_trap_is_named_and_the_run_really_diverges(name, level, dtype, optimizer, kwargs, overrides):
    losses, traps = _train(level, dtype, optimizer, kwargs, overrides)
    assert not math.isfinite(losses[-1]), "the configuration no longer diverges: the advice is stale"
    assert len(traps) == 1
    assert f"torch.optim.{optimizer}(eps=1e-08)" in traps[0]
    fix = "master_weights=True" if level == "O2" else "opt_level='O2'"  # (the script is at O2 already)
    assert fix in traps[0] and "eps>=0.0001" in traps[0] and "torch.bfloat16" in traps[0]


@pytest.mark.parametrize("name,level,dtype,optimizer,kwargs,overrides", SAFE, ids=[case[0] for case in SAFE])
def test_no_trap_reported_where_training_stays_finite(name, level, dtype, optimizer, kwargs, overrides):
    losses, traps = _train(level, dtype, optimizer, kwargs, overrides)
    assert all(math.isfinite(loss) for loss in losses)
    assert traps == []


def test_warn_known_traps_logs_one_warning_per_trapped_optimizer(caplog):
    model = torch.nn.Linear(4, 4)
    first, second = torch.optim.Adam(model.parameters()), torch.optim.SGD(model.parameters(), lr=0.1)
    model, (first, second) = amp.initialize(model, [first, second], opt_level="O3", verbosity=0)
    try:
        session = current_session()
        caplog.clear()  # initialize itself warned already; count only this call's warnings
        with caplog.at_level("WARNING", logger="apexlite.amp"):
            messages = warn_known_traps(session.properties, [first, second], session.dtype)
    finally:
        amp.deinitialize()
    assert len(messages) == 1 and "torch.optim.Adam(eps=1e-08)" in messages[0]
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("apexlite.amp", "WARNING", messages[0])]


class InheritedStepAdam(torch.optim.Adam):
    pass


class OwnStepAdam(torch.optim.Adam):
    def step(self, closure=None):
        return super().step(closure)


@pytest.mark.parametrize("optimizer_class,trapped", [(InheritedStepAdam, True), (OwnStepAdam, False)])
def test_subclasses_are_named_only_when_they_run_torchs_step(optimizer_class, trapped):
    """A subclass with its own step() may compute its update differently (in fp32, say): not guessed at."""
    model = torch.nn.Linear(4, 4)
    optimizer = optimizer_class(model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level="O3", verbosity=0)
    try:
        session = current_session()
        traps = find_known_traps(session.properties, [optimizer], session.dtype)
    finally:
        amp.deinitialize()
    if trapped:
        assert len(traps) == 1 and "torch.optim.Adam(eps=1e-08)" in traps[0]
    else:
        assert traps == []


SLOW_CPU_PROBE = """
import logging, sys, torch
from apexlite import amp

seen = []
class Keep(logging.Handler):
    def emit(self, record):
        seen.append((record.name, record.levelname, record.getMessage()))
logging.getLogger("apexlite").addHandler(Keep())
for level, dtype, verbosity in [(item.split(":") + ["1"])[:3] for item in sys.argv[1:]]:
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    amp.initialize(model, optimizer, opt_level=level, dtype=getattr(torch, dtype), verbosity=int(verbosity))
    amp.deinitialize()
print([entry for entry in seen if "few fast float16 kernels" in entry[2]])
"""


def _slow_cpu_advice(*configurations):
    """The slow-path records logged in a fresh process running initialize once per configuration."""
    import ast
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", SLOW_CPU_PROBE, *configurations], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return ast.literal_eval(result.stdout.strip().splitlines()[-1])


def test_float16_on_cpu_is_named_slow_once_per_process_with_the_alternatives():
    records = _slow_cpu_advice("O2:float16", "O2:float16", "O3:float16", "O1:float16")
    assert len(records) == 1
    name, level, message = records[0]
    assert (name, level) == ("apexlite.amp", "WARNING")
    assert message.startswith("O2 keeps float16 weights on CPU")
    assert "dtype=torch.bfloat16" in message and "APEXLITE_DTYPE=bfloat16" in message and "opt_level='O0'" in message


@pytest.mark.parametrize("configurations,expected", [
    (("O1:float16",), "O1 runs matmuls and convolutions in float16 on CPU"),
    (("O0:float16", "O2:bfloat16", "O3:bfloat16", "O1:bfloat16"), None),
    (("O1:float16:0", "O2:float16:0"), None),  # verbosity=0 silences amp's advice, as apex's prints
])
def test_the_advice_follows_the_dtype_the_run_computes_in(configurations, expected):
    records = _slow_cpu_advice(*configurations)
    assert [message.split(",")[0] for _, _, message in records] == ([expected.split(",")[0]] if expected else [])
