import torch
from apex import amp
from apex.fp16_utils import FP16_Optimizer

# TODO(apexlite migrate): `amp.init` has no certain torch rewrite: the pre-2019 handle API: use
#     torch.autocast and torch.amp.GradScaler
amp_handle = amp.init(enabled=True)
model = torch.nn.Linear(4, 4).half()
# TODO(apexlite migrate): `FP16_Optimizer` (apex.fp16_utils.FP16_Optimizer) has no exact torch
#     rewrite: it wraps the optimizer with fp32 master weights of an fp16 model, which torch has no
#     class for: drop the wrapper and `.half()`, keep the wrapped optimizer, and train the fp32
#     model under torch.autocast with a torch.amp.GradScaler: `optimizer.backward(loss)` becomes
#     `scaler.scale(loss).backward()`, `optimizer.step()` becomes `scaler.step(optimizer)` then
#     `scaler.update()`, `optimizer.clip_master_grads(n)` becomes `scaler.unscale_(optimizer)` then
#     `torch.nn.utils.clip_grad_norm_(model.parameters(), n)`
optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True)
