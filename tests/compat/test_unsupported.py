"""Placeholders for unsupported apex names: real classes until instantiated, functions that raise when called."""
import pytest
import torch

from apexlite.compat import ApexliteUnsupportedError, apex_aliases
from apexlite.compat._unsupported import UnsupportedModule, unsupported_class

# legacy module -> (class placeholder name, text the error must contain)
CLASS_PLACEHOLDERS = [
    ("apex.RNN", "LSTM", "torch.nn.LSTM"),
    ("apex.RNN", "GRU", "torch.nn.GRU"),
    ("apex.RNN", "ReLU", "nonlinearity='relu'"),
    ("apex.RNN", "Tanh", "nonlinearity='tanh'"),
    ("apex.RNN", "mLSTM", "LSTMCell"),
    ("apex.contrib.xentropy", "SoftmaxCrossEntropyLoss", "cross_entropy"),
    ("apex.transformer.tensor_parallel", "ColumnParallelLinear", "Megatron-Core"),
]


def _legacy(module_name, name):
    import importlib

    with apex_aliases():
        return getattr(importlib.import_module(module_name), name)


@pytest.mark.parametrize("module_name,name,advice", CLASS_PLACEHOLDERS)
def test_class_placeholder_works_in_type_checks_and_raises_only_when_instantiated(module_name, name, advice):
    placeholder = _legacy(module_name, name)
    assert isinstance(placeholder, type)
    assert placeholder.__name__ == name
    assert not isinstance(torch.nn.Linear(2, 2), placeholder)
    assert issubclass(placeholder, placeholder) and not issubclass(int, placeholder)

    class UserSubclass(placeholder):  # defining a subclass at import time must work
        pass

    assert issubclass(UserSubclass, placeholder)
    for cls in (placeholder, UserSubclass):
        with pytest.raises(ApexliteUnsupportedError, match=advice.replace("(", r"\(").replace(".", r"\.")):
            cls(4, 4, 1)


def test_unsupported_area_gives_the_same_placeholder_on_every_access():
    with apex_aliases():
        from apex.contrib.xentropy import SoftmaxCrossEntropyLoss as first
        from apex.contrib.xentropy import SoftmaxCrossEntropyLoss as second
        import apex.contrib.xentropy as xentropy

        assert first is second is xentropy.SoftmaxCrossEntropyLoss
        with pytest.raises(ApexliteUnsupportedError):
            xentropy.softmax_xentropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))  # a function in apex


def test_placeholder_can_take_apex_base_class():
    placeholder = unsupported_class("apex.example.Optim", "Use torch.optim.SGD.", bases=(torch.optim.Optimizer,))
    assert issubclass(placeholder, torch.optim.Optimizer)
    with pytest.raises(ApexliteUnsupportedError, match="apex.example.Optim is not supported by apexlite. Use"):
        placeholder([torch.zeros(1, requires_grad=True)])


def test_dunder_lookups_on_area_modules_stay_attribute_errors():
    module = UnsupportedModule("apex.contrib", "advice")
    assert not hasattr(module, "__wrapped__")  # inspect/pickle probes must not get a placeholder
    assert hasattr(module, "anything")
