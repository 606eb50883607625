import torch
from apex import amp
from apex.fp16_utils import FP16_Optimizer

# TODO(apexlite migrate): `amp.init` has no certain torch rewrite: the pre-2019 handle API: use
#     torch.autocast and torch.amp.GradScaler
amp_handle = amp.init(enabled=True)
model = torch.nn.Linear(4, 4).half()
# TODO(apexlite migrate): `FP16_Optimizer` has no certain torch rewrite
#     (apex.fp16_utils.FP16_Optimizer: differs: messages go to the apexlite logger;
#     inspect_master_grad_data is not provided); see MIGRATION.md
optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True)
