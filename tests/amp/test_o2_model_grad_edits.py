"""O2: an edit of the model's half grads between scale_loss and step (a clip of `model.parameters()`) does
not clip the update, which follows the fp32 masters (apex behaved the same, silently): apexlite says so once.
Reference: the update's norm, against the clip's max norm."""
import pytest
import torch

from apexlite import amp
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
