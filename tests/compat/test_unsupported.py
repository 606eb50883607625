"""Placeholders for apex names apexlite does not implement: importable, raising at use with the alternative."""
import importlib
import pickle

import pytest
import torch

from apexlite.compat import ApexliteUnsupportedError, apex_aliases
from apexlite.compat._unsupported import (
    UnsupportedObject, is_placeholder, unsupported, unsupported_class, unsupported_object,
)

# legacy module -> (class placeholder name, text the error must contain)
CLASS_PLACEHOLDERS = [
    ("apex.transformer.tensor_parallel", "ColumnParallelLinear", "Megatron-Core"),
    ("apex.transformer.functional.fused_softmax", "ScaledMaskedSoftmax", "Megatron-Core"),
    ("apex.contrib.sparsity", "ASP", "torch.sparse.to_sparse_semi_structured"),
    ("apex.amp.rnn_compat", "VariableFunctionsShim", "casts torch.nn RNNs itself"),
    ("apex.amp._process_optimizer", "AmpOptimizerState", "pass the optimizer to amp.initialize"),
]


def _legacy(module_name, name):
    with apex_aliases():
        return getattr(importlib.import_module(module_name), name)


@pytest.mark.parametrize("module_name,name,advice", CLASS_PLACEHOLDERS)
def test_class_placeholder_works_in_type_checks_and_raises_only_when_instantiated(module_name, name, advice):
    placeholder = _legacy(module_name, name)
    assert isinstance(placeholder, type) and is_placeholder(placeholder)
    assert placeholder.__name__ == name
    assert not isinstance(torch.nn.Linear(2, 2), placeholder)
    assert issubclass(placeholder, placeholder) and not issubclass(int, placeholder)

    class UserSubclass(placeholder):  # defining a subclass at import time must work
        pass

    assert issubclass(UserSubclass, placeholder)
    for cls in (placeholder, UserSubclass):
        with pytest.raises(ApexliteUnsupportedError, match=advice.replace(".", r"\.")):
            cls(4, 4, 1)


def test_public_class_attributes_raise_the_placeholder_error_private_ones_stay_attribute_errors():
    attn_mask_type = _legacy("apex.transformer.enums", "AttnMaskType")
    with pytest.raises(ApexliteUnsupportedError, match="apex.transformer.enums.AttnMaskType is not supported"):
        attn_mask_type.causal  # an enum member, as Megatron-style code reads it
    with pytest.raises(AttributeError):
        attn_mask_type._value2member_map_
    assert not hasattr(attn_mask_type, "__wrapped__")


def test_a_placeholder_can_sit_on_an_autograd_function_base():
    placeholder = unsupported_class("apex.example.FastFn", "Use torch.nn.functional.layer_norm.",
                                    bases=(torch.autograd.Function,))
    assert issubclass(placeholder, torch.autograd.Function)
    with pytest.raises(ApexliteUnsupportedError, match="Use torch.nn.functional.layer_norm"):
        placeholder.apply(torch.zeros(2))  # `apply` is inherited: it is the forward that apexlite lacks
    with pytest.raises(ApexliteUnsupportedError):
        placeholder.no_such_method


def test_placeholder_can_take_apex_base_class():
    placeholder = unsupported_class("apex.example.Optim", "Use torch.optim.SGD.", bases=(torch.optim.Optimizer,))
    assert issubclass(placeholder, torch.optim.Optimizer)
    with pytest.raises(ApexliteUnsupportedError, match="apex.example.Optim is not supported by apexlite. Use"):
        placeholder([torch.zeros(1, requires_grad=True)])


def test_function_placeholders_raise_when_called_and_say_what_they_are():
    with apex_aliases():
        from apex.amp.wrap import cached_cast
        from apex.transformer.parallel_state import initialize_model_parallel

    assert is_placeholder(cached_cast) and cached_cast.__name__ == "cached_cast"
    assert cached_cast.__module__ == "apex.amp.wrap"
    with pytest.raises(ApexliteUnsupportedError, match="amp.register_half_function"):
        cached_cast(torch, "mm", None, None)
    with pytest.raises(ApexliteUnsupportedError, match="Megatron-Core"):
        initialize_model_parallel(2)


def test_object_placeholders_raise_on_every_use_but_repr():
    placeholder = unsupported_object("apex.example.HAS_THING", "Use the torch feature.")
    assert "apex.example.HAS_THING is not supported" in repr(placeholder)
    assert is_placeholder(placeholder) and isinstance(placeholder, UnsupportedObject)
    uses = [bool, len, iter, str, lambda p: p(), lambda p: p.attribute, lambda p: p[0], lambda p: 1 in p,
            lambda p: setattr(p, "x", 1)]
    for use in uses:
        with pytest.raises(ApexliteUnsupportedError, match="Use the torch feature"):
            use(placeholder)
    with pytest.raises(AttributeError):
        placeholder._private


def test_module_level_objects_of_placeholder_modules_are_object_placeholders():
    has_ucc = _legacy("apex.transformer.parallel_state", "HAS_UCC")
    assert has_ucc is _legacy("apex.transformer._ucc_util", "HAS_UCC")  # a re-export is the same object
    with pytest.raises(ApexliteUnsupportedError, match="Megatron-Core"):
        if has_ucc:
            pass


def test_every_access_gives_the_same_placeholder():
    with apex_aliases():
        from apex.transformer.tensor_parallel import ColumnParallelLinear as first
        from apex.transformer.tensor_parallel import ColumnParallelLinear as second
        import apex.transformer.tensor_parallel as tensor_parallel
        from apex.amp.utils import set_func_save as func_first
        from apex.amp.utils import set_func_save as func_second

        assert first is second is tensor_parallel.ColumnParallelLinear
        assert func_first is func_second


def test_placeholder_classes_pickle_by_reference_like_any_class():
    placeholder = _legacy("apex.transformer.tensor_parallel", "ColumnParallelLinear")
    with apex_aliases():
        importlib.import_module("apex.transformer.tensor_parallel.layers")
        assert pickle.loads(pickle.dumps(placeholder)) is placeholder


def test_dunder_lookups_on_placeholder_modules_stay_attribute_errors():
    with apex_aliases():
        module = importlib.import_module("apex.transformer")
        assert not hasattr(module, "__wrapped__")  # inspect/pickle probes must not get a placeholder
        assert "tensor_parallel" in module.__all__ and "LayerType" in dir(module)


def test_is_placeholder_is_false_for_implementations():
    with apex_aliases():
        from apex.amp.utils import is_fp_tensor
        from apex.parallel.distributed import flat_dist_call

    for value in (is_fp_tensor, flat_dist_call, torch.nn.Linear, torch.zeros(1), 3, None):
        assert not is_placeholder(value)
    assert is_placeholder(unsupported("apex.x.f", "Use g."))
