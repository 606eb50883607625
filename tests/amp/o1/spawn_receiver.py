"""The body of the spawn worker in tests/amp/o1/test_pickling.py: what patched functions it receives.

It unpickles one batch of functions before calling amp.initialize and one after, and reports for each
whether it is the worker's own torch attribute (`is`) and the dtype it returns for fp32 inputs.
"""
import torch


def _installed(function):
    """The object a function read from a class stands for: a patched method's wrapper on the class."""
    from apexlite.amp.o1.function_wrappers import O1BoundMethod

    return function._self_parent if isinstance(function, O1BoundMethod) else function


def _report(functions, tensors):
    a, b = tensors
    current = [torch.mm, torch.Tensor.mm, torch.nn.functional.linear]
    same = [_installed(function) is _installed(now) for function, now in zip(functions, current)]
    return same, [str(function(a, b).dtype) for function in functions]


def receive(inbox, outbox) -> None:
    from apexlite import amp

    tensors = (torch.randn(4, 4), torch.randn(4, 4))
    without_amp = _report(inbox.get(timeout=300), tensors)
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    try:
        under_o1 = _report(inbox.get(timeout=300), tensors)
    finally:
        amp.deinitialize()
    outbox.put((without_amp, under_o1))
