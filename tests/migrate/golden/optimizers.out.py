import torch
from apex.optimizers import FusedAdam, FusedSGD, FusedLAMB

params = [torch.nn.Parameter(torch.randn(4, device="cuda"))]
adamw = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0, fused=True)
adamw_decay = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1, fused=True)
# apexlite migrate: `set_grad_none` dropped: optimizer.zero_grad() sets gradients to None unless
#     called with set_to_none=False
adam_l2 = torch.optim.Adam(params, lr=1e-3, weight_decay=1e-4, fused=True)
# TODO(apexlite migrate): `bias_correction=False`: no torch.optim.AdamW equivalent (torch's
#     Adam/AdamW always correct the moments' bias)
no_bias_correction = FusedAdam(params, lr=1e-3, bias_correction=False)
# apexlite migrate: `materialize_master_grads` dropped: it only shaped apex's O2 master gradients
sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, fused=True)
# TODO(apexlite migrate): `wd_after_momentum=True`: no torch.optim.SGD equivalent (torch's SGD adds
#     weight decay before momentum)
sgd_after = FusedSGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4, wd_after_momentum=True)
adagrad = torch.optim.Adagrad(params, lr=0.01)
# TODO(apexlite migrate): `FusedLAMB` (apex.optimizers.FusedLAMB) has no exact torch rewrite: torch
#     has no LAMB: keep apexlite's (`from apexlite.optimizers import FusedLAMB`) or choose a
#     torch.optim optimizer
lamb = FusedLAMB(params, lr=1e-3)
