"""Child-process fuzzer of the argument structures O1 wrappers walk (issue 18, item 4).

    python -m tests.amp.o1.argument_fuzz SEED ITERATIONS

Runs wrapped ops of every native policy (real torch ops, and one registered Python function per policy
that accepts anything) on random structures: nesting, self-reference, container and Tensor subclasses,
mock tensors, objects that mutate their container while it is walked, and containers that another
thread mutates all along. Any Python exception is an acceptable outcome; a crash is not. The cast path
is the one sessions choose (APEXLITE_DISABLE_EXTENSION=1 selects Python). Prints a summary line and
exits 0 when the process survived.
"""
from __future__ import annotations

import collections
import random
import sys
import threading
from typing import Any, Callable, List
from unittest import mock

import torch
import torch.nn.functional as F

from apexlite import amp


def echo_low(*args: Any, **kwargs: Any) -> Any:
    """Registered as a half function: O1 walks and casts whatever it is given."""
    return args, kwargs


def echo_float(*args: Any, **kwargs: Any) -> Any:
    return args, kwargs


def echo_promote(*args: Any, **kwargs: Any) -> Any:
    return args, kwargs


class ListSub(list):
    pass


class TupleSub(tuple):
    pass


class DictSub(dict):
    pass


Pair = collections.namedtuple("Pair", "first second")


class Tagged(torch.Tensor):
    """A Tensor subclass with its own conversions (never used by O1) and Python-level dispatch."""

    def half(self, *args, **kwargs):
        return torch.zeros_like(self, dtype=torch.float16)

    def bfloat16(self, *args, **kwargs):
        return torch.zeros_like(self, dtype=torch.bfloat16)


class Yielding(torch.Tensor):
    """A subclass whose __torch_function__ gives other threads the GIL in the middle of a walk."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        threading.Event().wait(0)
        return super().__torch_function__(func, types, args, kwargs or {})


class Mutator:
    """An argument that mutates the container holding it when anyone asks for its class or attributes."""

    def __init__(self, box: Any, rng: random.Random) -> None:
        self.box = box
        self.rng = rng

    def __getattribute__(self, name: str) -> Any:
        if name == "__class__":
            mutate(object.__getattribute__(self, "box"), object.__getattribute__(self, "rng"))
        return object.__getattribute__(self, name)


def mutate(box: Any, rng: random.Random) -> None:
    """One random edit of a list or dict (tuples cannot change)."""
    try:
        if isinstance(box, list):
            choice = rng.randrange(5)
            if choice == 0:
                box.clear()
            elif choice == 1 and box:
                box.pop(rng.randrange(len(box)))
            elif choice == 2:
                box.extend([torch.randn(2, 2), None] * rng.randrange(1, 20))
            elif choice == 3 and box:
                box[rng.randrange(len(box))] = torch.randn(2, 2, dtype=torch.float16)
            else:
                del box[: len(box) // 2]
        elif isinstance(box, dict):
            choice = rng.randrange(3)
            if choice == 0:
                box.clear()
            elif choice == 1:
                for index in range(rng.randrange(1, 40)):
                    box[f"k{rng.randrange(10 ** 6)}"] = torch.randn(2)
            elif box:
                box.pop(next(iter(box)))
    except (IndexError, RuntimeError, KeyError):
        pass


def leaf(rng: random.Random) -> Any:
    choice = rng.randrange(12)
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16, torch.float64])
    if choice < 4:
        return torch.randn(2, 2, dtype=dtype)
    if choice == 4:
        return torch.randn(2, 2).to(dtype).as_subclass(Tagged)
    if choice == 5:
        return torch.randn(2, 2).to(dtype).as_subclass(Yielding)
    if choice == 6:
        return torch.nn.Parameter(torch.randn(2, 2, dtype=dtype))
    if choice == 7:
        return mock.MagicMock(spec=torch.Tensor)
    if choice == 8:
        return torch.arange(4)
    return rng.choice([None, 3, 2.5, "text", b"bytes", object()])


CONTAINERS: List[Callable[[list], Any]] = [
    list, tuple, ListSub, TupleSub, lambda items: Pair(items[0] if items else None, items[1:]),
    lambda items: {f"k{i}": item for i, item in enumerate(items)},
    lambda items: collections.defaultdict(list, {f"k{i}": item for i, item in enumerate(items)}),
    lambda items: collections.OrderedDict((f"k{i}", item) for i, item in enumerate(items)),
    lambda items: DictSub((f"k{i}", item) for i, item in enumerate(items)),
]


def structure(rng: random.Random, depth: int, shared: List[Any]) -> Any:
    """A random argument; some lists and dicts also go to `shared` for the mutating thread."""
    if depth <= 0 or rng.random() < 0.3:
        return leaf(rng)
    items = [structure(rng, depth - 1, shared) for _ in range(rng.randrange(0, 5))]
    built = rng.choice(CONTAINERS)(items)
    if isinstance(built, list) and rng.random() < 0.3:
        built.append(Mutator(built, rng))
    if isinstance(built, dict) and rng.random() < 0.3:
        built["mutator"] = Mutator(built, rng)
    if isinstance(built, (list, dict)) and rng.random() < 0.2:
        if isinstance(built, list):
            built.append(built)  # self-reference
        else:
            built["self"] = built
    if isinstance(built, (list, dict)):
        shared.append(built)
    return built


def deep(rng: random.Random, levels: int) -> Any:
    value: Any = torch.randn(2, 2)
    for _ in range(levels):
        value = rng.choice([lambda v: [v], lambda v: (v,), lambda v: {"k": v}])(value)
    return value


def calls(module: Any) -> List[Callable[[Any], Any]]:
    """Wrapped entry points of every native policy, each given one fuzzed argument."""
    weight = torch.randn(2, 2)
    return [
        lambda arg: module.echo_low(arg, key=arg),
        lambda arg: module.echo_float(arg),
        lambda arg: module.echo_promote(torch.randn(2), arg, key=arg),
        lambda arg: torch.mm(weight, arg),
        lambda arg: torch.linalg.multi_dot(arg),
        lambda arg: torch.cat(arg),
        lambda arg: torch.stack(arg),
        lambda arg: torch.addcmul(weight, arg, weight),
        lambda arg: torch.exp(arg),
        lambda arg: F.linear(input=arg, weight=weight),
        lambda arg: weight.matmul(arg),
    ]


def main(seed: int, iterations: int) -> None:
    module = sys.modules[__name__]
    amp.register_half_function(module, "echo_low")
    amp.register_float_function(module, "echo_float")
    amp.register_promote_function(module, "echo_promote")
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    rng = random.Random(seed)
    shared: List[Any] = []
    stop = threading.Event()

    def mutate_shared() -> None:
        other = random.Random(seed + 1)
        while not stop.is_set():
            if shared:
                mutate(other.choice(shared), other)
            if len(shared) > 200:
                del shared[:100]

    sys.setswitchinterval(1e-6)
    worker = threading.Thread(target=mutate_shared, daemon=True)
    worker.start()
    outcomes: collections.Counter = collections.Counter()
    entry_points = calls(module)
    try:
        for index in range(iterations):
            arg = deep(rng, 50_000) if index % 50 == 7 else structure(rng, 6, shared)
            for call in entry_points:
                try:
                    call(arg)
                    outcomes["returned"] += 1
                except Exception as exc:  # any Python-level error is a fine outcome here
                    outcomes[type(exc).__name__] += 1
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(0.005)
        amp.deinitialize()
    print("survived", dict(sorted(outcomes.items())))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
