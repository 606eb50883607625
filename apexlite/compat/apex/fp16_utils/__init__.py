"""`apex.fp16_utils`: manual fp16 training helpers (FP16_Optimizer, network_to_half, master copies)."""
from apexlite.compat.apex.fp16_utils.fp16_optimizer import FP16_Optimizer  # noqa: F401
from apexlite.compat.apex.fp16_utils.fp16util import (  # noqa: F401
    BN_convert_float, FP16_Module, FP16Model, clip_grad_norm, convert_module, convert_network,
    master_params_to_model_params, model_grads_to_master_grads, network_to_half, prep_param_lists,
    to_python_float, tofp16,
)
from apexlite.compat.apex.fp16_utils.loss_scaler import DynamicLossScaler, LossScaler  # noqa: F401

__all__ = [
    "BN_convert_float", "network_to_half", "prep_param_lists", "model_grads_to_master_grads",
    "master_params_to_model_params", "tofp16", "to_python_float", "clip_grad_norm", "convert_module",
    "convert_network", "FP16Model", "FP16_Module", "FP16_Optimizer", "LossScaler", "DynamicLossScaler",
]
