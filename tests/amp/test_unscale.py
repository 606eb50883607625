"""apexlite.amp.unscale: both routes against fp32 arithmetic, and against each other, for the grad lists
O1/O2 produce (bf16/fp16 model grads beside fp32 ones, odd layouts, inf/NaN), and the route table.

On a GPU torch's fused unscale op refuses bfloat16 grads; here the CPU op takes them, so the foreach
route (what CUDA bf16 grads take) is forced and compared with the fused op bit for bit.
"""
import pytest
import torch

from apexlite import amp
from apexlite.amp import unscale
from apexlite.amp.scaler import LossScaler
from apexlite.optimizers import FusedAdam


def _grads(specs):
    """Tensors from (dtype, shape, layout) specs; layout 'contiguous', 'channels_last', 'transposed' or 'slice'."""
    made = []
    for dtype, shape, layout in specs:
        base = torch.randn(*shape) * 1000.0
        if layout == "channels_last":
            base = base.contiguous(memory_format=torch.channels_last)
        elif layout == "transposed":
            base = base.t()
        elif layout == "slice":
            base = base[:, ::2]
        made.append(base.to(dtype) if layout != "channels_last" else base.to(dtype, memory_format=torch.channels_last))
    return made


# (name, grad specs): the lists scale_loss hands to the scaler
GRAD_LISTS = [
    ("o2_bf16_model", [(torch.bfloat16, (8, 4), "contiguous"), (torch.bfloat16, (4,), "contiguous"),
                       (torch.float32, (4,), "contiguous")]),
    ("o2_fp16_model", [(torch.float16, (8, 4), "contiguous"), (torch.float32, (3, 5), "contiguous")]),
    ("bf16_conv_channels_last", [(torch.bfloat16, (4, 3, 3, 3), "channels_last"), (torch.bfloat16, (6, 5), "transposed")]),
    ("fp32_odd_layouts", [(torch.float32, (6, 8), "slice"), (torch.float32, (5, 7), "transposed")]),
]
# (name, where to put a non-finite value: (grad index, value) or None)
INJECTIONS = [("finite", None), ("inf_first", (0, float("inf"))), ("nan_last", (-1, float("nan"))),
              ("neg_inf_first", (0, float("-inf")))]


def _case(specs, injection):
    grads = _grads(specs)
    if injection is not None:
        index, value = injection
        grads[index][(0,) * grads[index].dim()] = value
    return grads


@pytest.mark.parametrize("injection", INJECTIONS, ids=[i[0] for i in INJECTIONS])
@pytest.mark.parametrize("specs", GRAD_LISTS, ids=[g[0] for g in GRAD_LISTS])
@pytest.mark.parametrize("route", [unscale.FUSED, unscale.FOREACH])
def test_route_unscales_as_fp32_arithmetic_and_flags_nonfinite(route, specs, injection):
    grads = _case(specs[1], injection[1])
    want = [(g.float() * (1.0 / 512.0)).to(g.dtype) for g in grads]
    strides = [g.stride() for g in grads]
    found = {}
    unscale.unscale_and_check(grads, 1.0 / 512.0, found, force_route=route)
    for got, expected, stride in zip(grads, want, strides):
        assert got.stride() == stride  # in place, layout kept
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    assert found[torch.device("cpu")].tolist() == [1.0 if injection[1] is not None else 0.0]


@pytest.mark.parametrize("specs", GRAD_LISTS, ids=[g[0] for g in GRAD_LISTS])
def test_foreach_route_equals_torch_fused_op_bit_for_bit(specs):
    fused = _grads(specs[1])
    foreach = [g.clone(memory_format=torch.preserve_format) for g in fused]
    flags_fused, flags_foreach = {}, {}
    unscale.unscale_and_check(fused, 0.125 / 3, flags_fused, force_route=unscale.FUSED)
    unscale.unscale_and_check(foreach, 0.125 / 3, flags_foreach, force_route=unscale.FOREACH)
    for a, b in zip(fused, foreach):
        assert torch.equal(a, b)
    assert torch.equal(flags_fused[torch.device("cpu")], flags_foreach[torch.device("cpu")])


def test_flag_is_never_reset_by_a_later_clean_group():
    found = {}
    unscale.unscale_and_check([torch.tensor([float("inf")], dtype=torch.bfloat16)], 1.0, found,
                              force_route=unscale.FOREACH)
    unscale.unscale_and_check([torch.ones(3, dtype=torch.bfloat16)], 1.0, found, force_route=unscale.FOREACH)
    assert found[torch.device("cpu")].item() == 1.0


# (device type, dtype, route): what the table gives; CUDA's fused op has no bfloat16
ROUTES = [("cuda", torch.bfloat16, unscale.FOREACH), ("cuda", torch.float16, unscale.FUSED),
          ("cuda", torch.float32, unscale.FUSED), ("cpu", torch.bfloat16, unscale.FUSED),
          ("cpu", torch.float16, unscale.FUSED), ("xpu", torch.bfloat16, None)]


@pytest.mark.parametrize("device_type,dtype,route", ROUTES)
def test_route_table(device_type, dtype, route):
    assert unscale.route_for(torch.device(device_type), dtype) == route


def test_unknown_device_falls_back_when_the_fused_op_refuses(monkeypatch):
    def refuse(*args):
        raise RuntimeError('"_amp_foreach_non_finite_check_and_unscale_cuda" not implemented for \'BFloat16\'')

    monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_", refuse)
    monkeypatch.setattr(unscale, "FUSED_DTYPES", {})  # the device is unknown to the table
    grads, found = [torch.tensor([2.0, float("nan")], dtype=torch.bfloat16)], {}
    unscale.unscale_and_check(grads, 0.5, found)
    assert grads[0][0].item() == 1.0 and found[torch.device("cpu")].item() == 1.0
    monkeypatch.setattr(unscale, "FUSED_DTYPES", {"cpu": (torch.bfloat16,)})  # a known route is not second-guessed
    with pytest.raises(RuntimeError, match="not implemented"):
        unscale.unscale_and_check(grads, 0.5, {})


def test_loss_scaler_unscales_through_the_route(monkeypatch):
    monkeypatch.setattr(unscale, "FUSED_DTYPES", {"cpu": unscale.FUSED_DTYPES["cuda"]})  # CPU routes as CUDA
    scaler = LossScaler("dynamic")
    grads = [torch.full((4,), 2.0 ** 17, dtype=torch.bfloat16), torch.full((2,), 2.0 ** 16)]
    scaler.unscale(grads)
    assert [g.tolist() for g in grads] == [[2.0] * 4, [1.0] * 2]
    assert not scaler.has_overflow()
    scaler.unscale([torch.tensor([float("inf")], dtype=torch.bfloat16)])
    assert scaler.has_overflow()


def _recording(function, dtypes):
    def record(grads, found_inf, inv_scale):
        dtypes.extend(g.dtype for g in grads)
        return function(grads, found_inf, inv_scale)
    return record


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.body(x))))


# (name, optimizer factory): torch's SGD keeps fp32 master grads; FusedAdam reads the scaled bf16 grads
OPTIMIZERS = [("sgd", lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)),
              ("fused_adam", lambda params: FusedAdam(params, lr=1e-2))]


def _train_o2_bf16_dynamic(make_optimizer, steps, inject_at):
    torch.manual_seed(0)
    model = _Net()
    optimizer = make_optimizer(model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", dtype=torch.bfloat16,
                                      loss_scale="dynamic", verbosity=0)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    scales = []
    try:
        for step in range(steps):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.to(torch.bfloat16)).float(), y)
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
                if step == inject_at:
                    model.body.weight.grad[0, 0] = float("inf")
            optimizer.step()
            scales.append(amp.state_dict()["loss_scaler0"]["loss_scale"])
        return [p.detach().clone() for p in model.parameters()], scales
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("make_optimizer", [o[1] for o in OPTIMIZERS], ids=[o[0] for o in OPTIMIZERS])
def test_o2_bf16_dynamic_scaling_trains_alike_on_both_routes(monkeypatch, make_optimizer):
    """The GPU crash's configuration: bf16 model grads under a dynamic scale, an overflow in step 2."""
    fused_params, fused_scales = _train_o2_bf16_dynamic(make_optimizer, 5, inject_at=2)
    routes = []
    monkeypatch.setattr(unscale, "FUSED_DTYPES", {"cpu": unscale.FUSED_DTYPES["cuda"]})
    monkeypatch.setattr(unscale, "unscale_foreach", _recording(unscale.unscale_foreach, routes))
    foreach_params, foreach_scales = _train_o2_bf16_dynamic(make_optimizer, 5, inject_at=2)
    if make_optimizer is OPTIMIZERS[1][1]:
        assert torch.bfloat16 in routes, "FusedAdam's O2 check of the bf16 grads did not take the foreach route"
    assert fused_scales == foreach_scales and fused_scales[2] == fused_scales[1] / 2
    for a, b in zip(fused_params, foreach_params):
        assert torch.equal(a, b)


@pytest.mark.parametrize("inject_inf", [False, True], ids=["finite", "inf"])
def test_o1_sparse_embedding_grads_are_unscaled_and_checked_like_torchs_grad_scaler(inject_inf):
    """Embedding(sparse=True) at O1: its sparse grad was handed to the unscale op, which refuses sparse tensors
    (a raw NotImplementedError). Its values are unscaled and checked, as torch's GradScaler reads them: the step
    equals torch.autocast + GradScaler's on the same model (the same fp16 matmul), and an inf skips it."""
    def model_and_optimizer():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(20, 8, sparse=True), torch.nn.Linear(8, 4))
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    tokens = torch.randint(0, 20, (6,), generator=torch.Generator().manual_seed(1))
    ours, optimizer = model_and_optimizer()
    initial = [p.detach().clone() for p in ours.parameters()]
    ours, optimizer = amp.initialize(ours, optimizer, opt_level="O1", verbosity=0)
    try:
        with amp.scale_loss(ours(tokens).float().pow(2).mean(), optimizer) as scaled:
            scaled.backward()
            if inject_inf:
                ours[0].weight.grad._values().view(-1)[0] = float("inf")
        optimizer.step()
    finally:
        amp.deinitialize()
    theirs, reference = model_and_optimizer()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = theirs(tokens).float().pow(2).mean()
    scaler.scale(loss).backward()
    if inject_inf:
        theirs[0].weight.grad._values().view(-1)[0] = float("inf")
    scaler.step(reference)
    for mine, torchs, start in zip(ours.parameters(), theirs.parameters(), initial):
        if inject_inf:
            assert torch.equal(mine, start)
        torch.testing.assert_close(mine, torchs, rtol=0, atol=1e-6)
