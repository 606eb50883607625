"""The O1 op tables are well formed, and the ops left to torch's promotion really promote."""
import pytest
import torch

from apexlite import amp
from apexlite.amp.o1.lists import natively_promoted_entries, op_entries
from apexlite.amp.o1.patches import torch_version
from apexlite.amp.o1.patcher import resolve
from tests._helpers.tolerances import dtype_tols

ENTRIES = op_entries()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.policy.name}:{e.qualname}")
def test_every_name_resolves_on_installed_torch(entry):
    if entry.min_torch is not None and torch_version() < entry.min_torch:
        pytest.skip(f"{entry.qualname} needs torch >= {entry.min_torch}")
    assert callable(getattr(resolve(entry.namespace), entry.name))


def test_no_name_is_under_two_policies():
    seen = {}
    for entry in ENTRIES:
        key = (entry.namespace, entry.name)
        assert key not in seen, f"{entry.qualname} is under {seen[key]} and {entry.policy}"
        seen[key] = entry.policy


def test_natively_promoted_names_are_not_patched():
    patched = {(e.namespace, e.name) for e in ENTRIES}
    assert not patched & set(natively_promoted_entries())


def _binary_case(namespace, name, a, b):
    if namespace == "torch":
        return getattr(torch, name)(a, b)
    return getattr(a, name)(b)


@pytest.mark.parametrize("namespace,name", natively_promoted_entries(), ids=lambda v: str(v))
@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_native_promotion_matches_widest_type_cast(namespace, name, low):
    """What apex's promote wrapper produced (cast to fp32, then op) is what torch computes natively."""
    a = torch.rand(8) + 0.5
    b = (torch.rand(8) + 0.5).to(low)
    if name.startswith("__i") or (name.endswith("_") and not name.startswith("__")):
        # in-place: self keeps its dtype (as apex's match-self wrapper did); the value is the fp32
        # computation rounded once, which is at least as accurate as apex's cast-other-then-op.
        target = b.clone()
        args = (a, a) if name in ("addcmul_", "addcdiv_") else (a,)
        result = getattr(target, name)(*args)
        reference = getattr(b.float().clone(), name)(*args)
        assert result is target and result.dtype is low
        torch.testing.assert_close(result.float(), reference, **dtype_tols(low))
        return
    result = _binary_case(namespace, name, b, a)
    expected = _binary_case(namespace, name, b.float(), a)
    assert result.dtype is expected.dtype
    torch.testing.assert_close(result, expected, rtol=0, atol=0)


ZERO_DIM_CASES = {"mul": lambda h, t: h * t, "add": lambda h, t: h + t, "div": lambda h, t: h / t,
                  "torch.mul": lambda h, t: torch.mul(h, t)}


@pytest.mark.parametrize("op", ZERO_DIM_CASES.values(), ids=list(ZERO_DIM_CASES))
def test_a_zero_dim_fp32_operand_keeps_the_low_precision_dtype_as_under_autocast(op):
    """The one documented departure from apex's cast-then-op (README, "Deliberate differences"): the reference
    is torch.autocast, which leaves these ops to torch's promotion too; apex's wrapper returned fp32."""
    h, t = torch.rand(4).to(torch.bfloat16), torch.tensor(2.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = op(h, t)
    amp.initialize(torch.nn.Linear(1, 1), opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        result = op(h, t)
    finally:
        amp.deinitialize()
    assert result.dtype is expected.dtype is torch.bfloat16 and torch.equal(result, expected)
    assert op(h.float(), t).dtype is torch.float32  # what apex's cast-then-op gave
