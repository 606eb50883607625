"""apex's multi-tensor kernels (the functions of ``amp_C``) with apex's signatures and semantics.

Each is called as ``op(chunk_size, noop_flag, tensor_lists, *args)``, directly or through
``apex.multi_tensor_apply.multi_tensor_applier(op, noop_flag, tensor_lists, *args)``. ``chunk_size`` is
accepted and unused. They run on CPU and CUDA tensors and use apexlite's own update rules: the Adam
kernels go through apexlite's fused Adam step, the other optimizer kernels through the rule their
optimizer class uses, so each update rule exists once. Like apex's CUDA kernels, they write their
tensors in place outside autograd, so params that require grad may be passed directly.
"""
from apexlite.optimizers.multi_tensor.adagrad import multi_tensor_adagrad
from apexlite.optimizers.multi_tensor.adam import (
    multi_tensor_adam, multi_tensor_adam_capturable, multi_tensor_adam_capturable_master,
)
from apexlite.optimizers.multi_tensor.lamb import (
    multi_tensor_lamb, multi_tensor_lamb_mp, multi_tensor_lamb_stage1_cuda, multi_tensor_lamb_stage2_cuda,
)
from apexlite.optimizers.multi_tensor.norms import (
    multi_tensor_axpby, multi_tensor_l2norm, multi_tensor_l2norm_mp, multi_tensor_l2norm_scale, multi_tensor_scale,
    multi_tensor_unscale_l2norm,
)
from apexlite.optimizers.multi_tensor.novograd import multi_tensor_novograd
from apexlite.optimizers.multi_tensor.sgd import multi_tensor_sgd

__all__ = [
    "multi_tensor_adagrad", "multi_tensor_adam", "multi_tensor_adam_capturable",
    "multi_tensor_adam_capturable_master", "multi_tensor_axpby", "multi_tensor_l2norm", "multi_tensor_l2norm_mp",
    "multi_tensor_l2norm_scale", "multi_tensor_lamb", "multi_tensor_lamb_mp", "multi_tensor_lamb_stage1_cuda",
    "multi_tensor_lamb_stage2_cuda", "multi_tensor_novograd", "multi_tensor_scale", "multi_tensor_sgd",
    "multi_tensor_unscale_l2norm",
]
