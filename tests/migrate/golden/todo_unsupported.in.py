import torch
from apex import amp
from apex.fp16_utils import FP16_Optimizer

amp_handle = amp.init(enabled=True)
model = torch.nn.Linear(4, 4).half()
optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True)
