"""`amp_C`: apex's multi-tensor kernels that third-party code calls directly.

Argument order follows apex: (chunk_size, noop_flag, tensor_lists, *args); `chunk_size` is accepted
and unused. The kernels live in :mod:`apexlite.optimizers.multi_tensor` (apexlite's own update rules,
on CPU and CUDA); `update_scale_hysteresis` in :mod:`apexlite.compat.loss_scale_hysteresis`.
"""
from apexlite.compat.loss_scale_hysteresis import update_scale_hysteresis
from apexlite.optimizers.multi_tensor import (
    multi_tensor_adagrad, multi_tensor_adam, multi_tensor_adam_capturable, multi_tensor_adam_capturable_master,
    multi_tensor_axpby, multi_tensor_l2norm, multi_tensor_l2norm_mp, multi_tensor_l2norm_scale, multi_tensor_lamb,
    multi_tensor_lamb_mp, multi_tensor_lamb_stage1_cuda, multi_tensor_lamb_stage2_cuda, multi_tensor_novograd,
    multi_tensor_scale, multi_tensor_sgd, multi_tensor_unscale_l2norm,
)

__all__ = [
    "multi_tensor_adagrad", "multi_tensor_adam", "multi_tensor_adam_capturable",
    "multi_tensor_adam_capturable_master", "multi_tensor_axpby", "multi_tensor_l2norm", "multi_tensor_l2norm_mp",
    "multi_tensor_l2norm_scale", "multi_tensor_lamb", "multi_tensor_lamb_mp", "multi_tensor_lamb_stage1_cuda",
    "multi_tensor_lamb_stage2_cuda", "multi_tensor_novograd", "multi_tensor_scale", "multi_tensor_sgd",
    "multi_tensor_unscale_l2norm", "update_scale_hysteresis",
]
