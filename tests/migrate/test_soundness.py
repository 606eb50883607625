"""The definite-assignment analysis behind migrate's last check (apexlite.migrate.soundness), and the
check itself: a rewrite that leaves a name undefined on a path where the original defined it is refused.

Each case is a small program and the (scope, name) reads some path reaches with the name unbound; the
controls show the same program with the name defined on every path.
"""
import textwrap

import pytest

from apexlite.migrate import engine
from apexlite.migrate.soundness import undefined_reads

CASES = {
    "assigned in one branch": ("""
        def train(fp16):
            if fp16:
                scaler = 1
            scaler.step()
        """, {("train", "scaler")}),
    "assigned in both branches": ("""
        def train(fp16):
            if fp16:
                scaler = 1
            else:
                scaler = 2
            scaler.step()
        """, set()),
    "read under the same test (paths are not correlated)": ("""
        def train(fp16):
            if fp16:
                scaler = 1
            if fp16:
                scaler.step()
        """, {("train", "scaler")}),
    "loop body may not run": ("""
        for step in range(3):
            last = step
        print(last, step)
        """, {("<module>", "last"), ("<module>", "step")}),
    "while True leaves by break only": ("""
        while True:
            value = 1
            break
        print(value)
        """, set()),
    "break before the assignment": ("""
        while True:
            if ready():
                break
            value = 1
        print(value)
        """, {("<module>", "value")}),
    "try body may fail before the assignment": ("""
        try:
            import apex
            scaler = 1
        except ImportError:
            pass
        print(scaler)
        """, {("<module>", "scaler")}),
    "every handler assigns": ("""
        try:
            flag = True
        except ImportError:
            flag = False
        print(flag)
        """, set()),
    "handler that raises": ("""
        try:
            from apex import amp
        except ImportError:
            raise SystemExit("install apex")
        print(amp)
        """, set()),
    "finally runs on every path": ("""
        try:
            work()
        finally:
            done = True
        print(done)
        """, set()),
    "a function reads a global made only under a flag": ("""
        import sys
        if len(sys.argv) > 1:
            scaler = 1
        def step():
            return scaler
        """, {("step", "scaler")}),
    "the __main__ block counts as run": ("""
        def step():
            return scaler
        if __name__ == "__main__":
            scaler = 1
            step()
        """, set()),
    "a closure sees the enclosing state at its def": ("""
        def outer(flag):
            if flag:
                scaler = 1
            def inner():
                return scaler
            return inner
        """, {("outer.inner", "scaler")}),
    "or at the end of the enclosing function": ("""
        def outer(loader):
            def step(batch):
                return scaler.scale(batch)
            scaler = make()
            for batch in loader:
                step(batch)
        """, set()),
    "comprehension targets are local": ("""
        values = [item * 2 for item in range(3)]
        """, set()),
    "with binds its target": ("""
        with open("f") as handle:
            data = handle.read()
        print(data)
        """, set()),
    "match with a catch-all": ("""
        match command:
            case "a":
                action = 1
            case _:
                action = 2
        print(action)
        """, set()),
    "match without a catch-all": ("""
        match command:
            case "a":
                action = 1
            case other:
                if other:
                    action = 2
        print(action)
        """, {("<module>", "action")}),
    "del unbinds": ("""
        value = 1
        del value
        print(value)
        """, {("<module>", "value")}),
    "augmented assignment reads first": ("""
        def count():
            total += 1
        """, {("count", "total")}),
}


@pytest.mark.parametrize("source,expected", CASES.values(), ids=list(CASES))
def test_undefined_reads(source, expected):
    assert set(undefined_reads(textwrap.dedent(source).encode())) == expected


GUARDED_BY_HAND = """
import torch
from apex import amp


def main(fp16):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        try:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        except RuntimeError:
            continue
        loss = model(torch.randn(2, 2)).sum()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
    print(amp.state_dict())
"""


def test_a_rewrite_with_a_name_undefined_on_some_path_leaves_amp_to_the_user():
    """The GradScaler would be made inside the `try` of a loop and read after it: refused (a TODO at
    amp.initialize, exit 1), never reported as complete."""
    result = engine.migrate_source(GUARDED_BY_HAND.encode())
    assert result.exit_status == 1 and result.error is None
    assert len(result.todos) == 1 and "`scaler` on a path that does not define it" in result.todos[0].message
    assert b"amp.initialize(model, optimizer" in result.migrated


def test_the_check_refuses_what_it_finds(monkeypatch):
    """With the amp part's fallback disabled, the engine keeps the original and says why."""
    monkeypatch.setattr(engine, "_plan", _without_fallback(engine._plan))
    result = engine.migrate_source(GUARDED_BY_HAND.encode())
    assert result.migrated == result.original and result.exit_status == 1
    assert "would read scaler where some path leaves it undefined" in result.error


def _without_fallback(plan):
    def plan_ignoring_refusal(parsed, group, options, refused_amp, resolve):
        return plan(parsed, group, options, None, resolve)

    return plan_ignoring_refusal
