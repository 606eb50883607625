import torch
from apex.optimizers import FusedAdam, FusedSGD, FusedAdagrad, FusedLAMB

params = [torch.nn.Parameter(torch.randn(4, device="cuda"))]
adamw = FusedAdam(params, lr=1e-3)
adamw_decay = FusedAdam(params, 1e-3, True, (0.9, 0.99), 1e-6, weight_decay=0.1)
adam_l2 = FusedAdam(params, lr=1e-3, adam_w_mode=False, weight_decay=1e-4, set_grad_none=False)
no_bias_correction = FusedAdam(params, lr=1e-3, bias_correction=False)
sgd = FusedSGD(params, lr=0.1, momentum=0.9, nesterov=True, materialize_master_grads=False)
sgd_after = FusedSGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4, wd_after_momentum=True)
adagrad = FusedAdagrad(params, lr=0.01)
lamb = FusedLAMB(params, lr=1e-3)
