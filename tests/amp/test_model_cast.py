"""O2/O3's casts around forward (model_cast.py): floating tensors, nested, and other values with a `.to`
method (a batch class) through it, as apex's O2/O3 did; a module passed in is left alone."""
import pytest
import torch

from apexlite import amp


@pytest.fixture(autouse=True)
def _teardown():
    yield
    amp.deinitialize()


class Batch:
    """A training loop's batch object: `.to(...)` returns a moved/cast copy (what apex called)."""

    def __init__(self, features, labels):
        self.features, self.labels = features, labels

    def to(self, *args, **kwargs):
        return Batch(self.features.to(*args, **kwargs), self.labels)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, batch, helper=None):
        assert helper is None or next(helper.parameters()).dtype is torch.float32  # a module is not cast
        return Batch(self.layer(batch.features), batch.labels)


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_inputs_and_outputs_with_a_to_method_are_cast_through_it(level):
    model = Net()
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.layer.state_dict())
    model = amp.initialize(model, opt_level=level, dtype=torch.bfloat16, verbosity=0)
    features, labels = torch.randn(3, 4), torch.tensor([0, 1, 1])
    out = model(Batch(features, labels), helper=torch.nn.Linear(1, 1))
    assert out.features.dtype is torch.float32 and out.labels is labels  # outputs back in fp32, as apex did
    expected = reference.to(torch.bfloat16)(features.to(torch.bfloat16)).float()
    assert torch.equal(out.features, expected)
