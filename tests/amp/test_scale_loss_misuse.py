"""The two slips of a scale_loss block that trained wrongly without a word (apex had both):
- `scaled_loss.backward()` dedented below the block: the grads reached the step multiplied by the loss scale
  at O1/O3 (O2 already refused the step). Now that backward raises before it writes any grad;
- `loss.backward()` inside the block instead of the scaled loss: the grads were divided by the loss scale on
  leaving. Now a warning names it (a block that made no grads at all, a skipped batch, is not warned).
The reference is the same model stepped through a correct block.
"""
import logging

import pytest
import torch

from apexlite import amp
from apexlite.amp.errors import AmpUsageError

LEVELS = ["O1", "O2", "O3"]


def build(opt_level):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return amp.initialize(model, opt, opt_level=opt_level, dtype=torch.bfloat16, loss_scale="dynamic", verbosity=0)


def loss_of(model):
    return model(torch.ones(8, 4)).float().sum()


@pytest.mark.parametrize("opt_level", LEVELS)
def test_backward_after_the_block_raises_before_touching_grads(opt_level):
    model, opt = build(opt_level)
    try:
        with amp.scale_loss(loss_of(model), opt) as scaled:
            pass
        with pytest.raises(AmpUsageError, match="after its `with` block ended"):
            scaled.backward()
        assert all(param.grad is None for param in model.parameters())
        with amp.scale_loss(loss_of(model), opt) as scaled:  # the loop can go on with a correct block
            scaled.backward()
        opt.step()
        stepped = [param.detach().clone() for param in model.parameters()]
    finally:
        amp.deinitialize()
    reference, reference_opt = build(opt_level)  # one correct block from the same start
    try:
        with amp.scale_loss(loss_of(reference), reference_opt) as scaled:
            scaled.backward()
        reference_opt.step()
        assert all(torch.equal(a, b) for a, b in zip(stepped, reference.parameters()))
    finally:
        amp.deinitialize()


NOT_BACKPROPAGATED = "without a backward of the scaled loss"


def logged_while(opt_level, caplog, blocks):
    """Run `blocks(model, optimizer)` on a fresh initialized model; return what apexlite logged meanwhile."""
    model, opt = build(opt_level)
    try:
        with caplog.at_level(logging.WARNING, logger="apexlite"):
            blocks(model, opt)
    finally:
        amp.deinitialize()
    return caplog.text


def correct_blocks(model, opt):
    with amp.scale_loss(loss_of(model), opt) as scaled:
        scaled.backward()
    with amp.scale_loss(loss_of(model), opt) as scaled:
        torch.autograd.backward([scaled])


def block_skipping_a_nan_loss(model, opt):
    """`if torch.isfinite(scaled): scaled.backward()`: no grads were made, so nothing was divided."""
    with amp.scale_loss(loss_of(model) * float("nan"), opt) as scaled:
        if torch.isfinite(scaled):
            scaled.backward()


def block_with_unscaled_backward(model, opt):
    with amp.scale_loss(loss_of(model), opt):
        loss_of(model).backward()


@pytest.mark.parametrize("opt_level", LEVELS)
@pytest.mark.parametrize("blocks", [correct_blocks, block_skipping_a_nan_loss], ids=lambda f: f.__name__)
def test_blocks_that_divided_nothing_are_not_warned(opt_level, blocks, caplog):
    assert NOT_BACKPROPAGATED not in logged_while(opt_level, caplog, blocks)


@pytest.mark.parametrize("opt_level", LEVELS)
def test_unscaled_backward_inside_the_block_is_warned(opt_level, caplog):
    text = logged_while(opt_level, caplog, block_with_unscaled_backward)
    assert NOT_BACKPROPAGATED in text and "65536" in text
