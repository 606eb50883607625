"""apex's O1 cast lists (apex.amp.lists.*_overrides): apex's names, and appending one acts on O1 as apex's did."""
import pytest
import torch
import torch.nn.functional as F

from apexlite.amp.o1.lists import NATIVELY_PROMOTED, TABLES
from apexlite.amp.o1.policies import CastPolicy
from apexlite.amp.o1.registry import PendingRegistrations
from apexlite.compat import apex_aliases
from apexlite.compat.apex.amp.lists import functional_overrides, tensor_overrides, torch_overrides
from apexlite.compat.cast_lists import CastList, CastListChangeError

LISTS = [(module, name) for module in (functional_overrides, torch_overrides, tensor_overrides)
         for name in ("FP16_FUNCS", "FP32_FUNCS", "CASTS", "SEQUENCE_CASTS") if hasattr(module, name)]
_POLICY_OF_LIST = {"FP16_FUNCS": CastPolicy.LOW_PRECISION, "FP32_FUNCS": CastPolicy.FLOAT,
                   "CASTS": CastPolicy.PROMOTE, "SEQUENCE_CASTS": CastPolicy.SEQUENCE_PROMOTE}
# apex promoted `scalar / tensor`; apexlite's table computes it in fp32 (a reciprocal, like torch.reciprocal)
_CAST_TO_FP32_INSTEAD = {("torch.Tensor", "__rtruediv__"), ("torch.Tensor", "__rdiv__")}


@pytest.fixture
def restore_lists():
    """Undo the appends a test makes (the lists themselves refuse removal) and drop pending registrations."""
    saved = {(module.__name__, name): list(getattr(module, name)) for module, name in LISTS}
    yield
    for module, name in LISTS:
        current = getattr(module, name)
        list.__delitem__(current, slice(None))
        list.extend(current, saved[(module.__name__, name)])
    PendingRegistrations.take()


@pytest.mark.parametrize("module,name", LISTS, ids=[f"{m.__name__.rsplit('.', 1)[1]}.{n}" for m, n in LISTS])
def test_apexs_lists_are_covered_by_apexlites_o1_table(module, name):
    """Every op apex's O1 cast is cast the same way by apexlite's (or left to torch's identical promotion)."""
    namespace = module.MODULE.__name__ if module.MODULE is not torch.Tensor else "torch.Tensor"
    policy = _POLICY_OF_LIST[name]
    covered = set(TABLES[policy].get(namespace, "").split())
    if policy is CastPolicy.PROMOTE:
        covered |= set(NATIVELY_PROMOTED.get(namespace, "").split())
    if policy is CastPolicy.PROMOTE:
        covered |= {op for space, op in _CAST_TO_FP32_INSTEAD if space == namespace}
    names = getattr(module, name)
    assert isinstance(names, CastList)
    assert not set(names) - covered


def test_the_lists_hold_apexs_names():
    assert functional_overrides.FP16_FUNCS[-1] == "linear" and "conv_tbc" in functional_overrides.FP16_FUNCS
    assert functional_overrides.BANNED_FUNCS[0][0] == "binary_cross_entropy"
    assert "BCEWithLogitsLoss" in functional_overrides.BANNED_FUNCS[0][1]
    assert torch_overrides.SEQUENCE_CASTS == ["cat", "stack"]
    assert ("bmm" in torch_overrides.FP16_FUNCS) == (torch.version.cuda is not None)  # apex: CUDA builds only
    assert "__matmul__" in tensor_overrides.FP16_FUNCS and "cpu" in tensor_overrides.FP32_FUNCS
    assert tensor_overrides.SEQUENCE_CASTS == []  # torch.Tensor has neither cat nor stack
    assert {op for _, op in _CAST_TO_FP32_INSTEAD} <= set(TABLES[CastPolicy.FLOAT]["torch.Tensor"].split())
    assert torch_overrides.version_num == float(".".join(torch.__version__.split(".")[:2]))


@pytest.mark.parametrize("list_module,list_name,call,low_input,expected_dtype", [
    (torch_overrides, "FP32_FUNCS", lambda x: torch.sigmoid(x), True, torch.float32),
    (functional_overrides, "FP32_FUNCS", lambda x: F.silu(x), True, torch.float32),
    (tensor_overrides, "FP16_FUNCS", lambda x: x.tanh(), False, torch.float16),
])
def test_an_appended_op_is_cast_from_the_next_initialize(restore_lists, list_module, list_name, call, low_input,
                                                         expected_dtype):
    op = {"FP32_FUNCS": {torch_overrides: "sigmoid", functional_overrides: "silu"}, "FP16_FUNCS": {
        tensor_overrides: "tanh"}}[list_name][list_module]
    x = torch.randn(8).to(torch.float16 if low_input else torch.float32)
    reference = call(x.to(expected_dtype))
    assert call(x).dtype == x.dtype  # torch itself keeps the input's dtype
    with apex_aliases():
        from apex import amp

        getattr(list_module, list_name).append(op)
        model = torch.nn.Linear(2, 2)
        amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O1", verbosity=0)
        try:
            out = call(x)
        finally:
            amp.deinitialize()
    assert out.dtype == expected_dtype
    torch.testing.assert_close(out, reference)
    assert call(x).dtype == x.dtype  # deinitialize took the cast away again


def test_the_old_api_honours_appends_too(restore_lists):
    torch_overrides.FP32_FUNCS.extend(["sigmoid"])
    with apex_aliases():
        from apex import amp

        handle = amp.init(verbose=False)
        try:
            assert torch.sigmoid(torch.randn(4).half()).dtype == torch.float32
        finally:
            handle._deactivate()
            amp.deinitialize()


@pytest.mark.parametrize("change", [
    lambda lst: lst.remove(lst[0]), lambda lst: lst.pop(), lambda lst: lst.clear(),
    lambda lst: lst.__setitem__(0, "exp"), lambda lst: lst.__delitem__(0), lambda lst: lst.sort(),
    lambda lst: lst.reverse(),
])
def test_changes_apexlite_cannot_honour_raise(restore_lists, change):
    before = list(torch_overrides.FP32_FUNCS)
    with pytest.raises(CastListChangeError, match="apex.amp.lists.torch_overrides.FP32_FUNCS"):
        change(torch_overrides.FP32_FUNCS)
    assert torch_overrides.FP32_FUNCS == before and PendingRegistrations.items == []


def test_rebinding_a_list_and_appending_to_the_banned_list_raise(restore_lists):
    with pytest.raises(CastListChangeError, match="Rebinding"):
        torch_overrides.FP32_FUNCS = ["exp"]
    assert isinstance(torch_overrides.FP32_FUNCS, CastList)
    with pytest.raises(CastListChangeError, match="BANNED_FUNCS"):
        functional_overrides.BANNED_FUNCS.append(("softmax", "no"))
    torch_overrides.some_new_attribute = 1  # other attributes stay ordinary
    del torch_overrides.some_new_attribute


def test_bad_appends_raise_before_anything_is_registered(restore_lists):
    with pytest.raises(ValueError, match="No function named no_such_op"):
        torch_overrides.FP32_FUNCS.append("no_such_op")
    with pytest.raises(TypeError, match="op names"):
        torch_overrides.FP16_FUNCS += [torch.mm]
    assert PendingRegistrations.items == []
    assert "no_such_op" not in torch_overrides.FP32_FUNCS
