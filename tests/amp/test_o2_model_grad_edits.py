"""O2: an edit of the model's half grads between scale_loss and step (a clip of `model.parameters()`) does
not clip the update, which follows the fp32 masters (apex behaved the same, silently): apexlite says so once.
Reference: the update's norm, against the clip's max norm."""
import pytest
import torch

from apexlite import amp
from apexlite.amp.grad_strategy import spread
from apexlite.optimizers import FusedAdam

MESSAGE = "does not clip the update"
OPTIMIZERS = [("sgd", lambda params: torch.optim.SGD(params, lr=1.0)),
              ("fused-adam", lambda params: FusedAdam(params, lr=1.0))]


def _step(model, optimizer, clip):
    loss = (model(torch.full((2, 4), 10.0)).float() ** 2).mean() * 100
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(clip(model, optimizer), 1.0)
    before = [m.detach().clone() for m in amp.master_params(optimizer)]
    optimizer.step()
    optimizer.zero_grad()
    return float(torch.stack([(m.detach() - b).norm() for m, b in zip(amp.master_params(optimizer), before)]).norm())


@pytest.mark.parametrize("make_optimizer", [o[1] for o in OPTIMIZERS], ids=[o[0] for o in OPTIMIZERS])
@pytest.mark.parametrize("clip, warned", [(lambda model, optimizer: model.parameters(), True),
                                          (lambda model, optimizer: amp.master_params(optimizer), False),
                                          (None, False)], ids=["model-params", "master-params", "no-clip"])
def test_a_clip_of_the_model_grads_at_o2_is_said_once(caplog, make_optimizer, clip, warned):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    model, optimizer = amp.initialize(model, make_optimizer(model.parameters()), opt_level="O2",
                                      cast_model_type=torch.bfloat16, loss_scale=1024.0, verbosity=0)
    try:
        with caplog.at_level("WARNING", logger="apexlite.amp"):
            update = _step(model, optimizer, clip)
            _step(model, optimizer, clip)
        said = [record for record in caplog.records if MESSAGE in record.getMessage()]
        assert len(said) == (1 if warned else 0)
        if warned and isinstance(optimizer, torch.optim.SGD):
            assert update > 100  # the warning is true: the update was not clipped
        if clip is not None and not warned and isinstance(optimizer, torch.optim.SGD):
            assert update == pytest.approx(1.0, rel=1e-3)
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("count, picked", [(0, []), (1, [0]), (2, [0, 1]), (3, [0, 1, 2]), (7, [0, 3, 6])])
def test_spread_takes_the_first_middle_and_last(count, picked):
    assert spread(list(range(count))) == picked


# which layers of a 5-layer model the clip touches: any clip of a whole block touches the first, middle or last
# param of the model (only those grads are watched, so the watch costs the same at any param count)
PARTS = [("first-layer", slice(0, 1)), ("middle-layer", slice(2, 3)), ("last-layer", slice(4, 5)),
         ("all-but-first", slice(1, 5))]


@pytest.mark.parametrize("make_optimizer", [o[1] for o in OPTIMIZERS], ids=[o[0] for o in OPTIMIZERS])
@pytest.mark.parametrize("part", [p[1] for p in PARTS], ids=[p[0] for p in PARTS])
def test_a_clip_of_part_of_the_model_grads_is_said(caplog, make_optimizer, part):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])
    model, optimizer = amp.initialize(model, make_optimizer(model.parameters()), opt_level="O2",
                                      cast_model_type=torch.bfloat16, loss_scale=1024.0, verbosity=0)
    try:
        clip = lambda model, optimizer: [p for layer in list(model)[part] for p in layer.parameters()]  # noqa: E731
        with caplog.at_level("WARNING", logger="apexlite.amp"):
            _step(model, optimizer, clip)
        assert [r for r in caplog.records if MESSAGE in r.getMessage()]
    finally:
        amp.deinitialize()
