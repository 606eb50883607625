"""`apex.fp16_utils.fp16util`: manual fp16 model conversion and master-weight helpers."""
from __future__ import annotations

from typing import Any, List, Tuple

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.modules.batchnorm import _BatchNorm

from apexlite.amp.model_cast import convert_network as _convert_network

clip_grad_norm = torch.nn.utils.clip_grad_norm_
TORCH_MAJOR, TORCH_MINOR = (int(part) for part in torch.__version__.split(".")[:2])


def backwards_debug_hook(grad: torch.Tensor) -> None:
    """A tensor hook that raises: register it on fp32 masters to catch a backward pass that reaches them."""
    raise RuntimeError("master_params received a gradient in the backward pass; only the model's params should.")


class tofp16(torch.nn.Module):
    """A module whose forward returns `input.half()` (the first layer of `network_to_half`)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input.half()


def BN_convert_float(module: torch.nn.Module) -> torch.nn.Module:
    """Cast every affine batchnorm layer back to fp32 (in place); returns `module`."""
    for sub in module.modules():
        if isinstance(sub, _BatchNorm) and sub.affine:
            sub.float()
    return module


def network_to_half(network: torch.nn.Module) -> torch.nn.Sequential:
    """`Sequential(tofp16(), network.half())` with affine batchnorm kept fp32 (state-dict keys gain `1.`)."""
    return torch.nn.Sequential(tofp16(), BN_convert_float(network.half()))


def convert_module(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast the module's own floating params (and their grads) and buffers to `dtype`, not recursing."""
    for param in module.parameters(recurse=False):
        if param is not None and param.is_floating_point():
            param.data = param.data.to(dtype)
            if param._grad is not None and param._grad.is_floating_point():
                param._grad.data = param._grad.data.to(dtype)
    for name, buffer in module.named_buffers(recurse=False):
        if buffer is not None and buffer.is_floating_point():
            module._buffers[name] = buffer.to(dtype)


def convert_network(network: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast every submodule except affine batchnorm layers to `dtype`; returns `network`."""
    _convert_network(network, dtype, keep_batchnorm_fp32=True)
    return network


class FP16Model(torch.nn.Module):
    """Holds `network` converted to fp16 (affine batchnorm kept fp32); casts every input to fp16."""

    def __init__(self, network: torch.nn.Module) -> None:
        super().__init__()
        self.network = convert_network(network, dtype=torch.half)

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.network(*(t.half() for t in inputs))


FP16_Module = FP16Model


def prep_param_lists(model: torch.nn.Module, flat_master: bool = False
                     ) -> Tuple[List[torch.nn.Parameter], List[torch.Tensor]]:
    """(model params that require grad, fp32 master copies); `flat_master` gives one flat master."""
    model_params = [p for p in model.parameters() if p.requires_grad]
    if flat_master:
        if len({p.dtype for p in model_params}) > 1:
            raise TypeError("prep_param_lists(flat_master=True): the model mixes parameter dtypes "
                            f"{sorted(str(p.dtype) for p in model_params)}; use flat_master=False.")
        flat = torch.nn.Parameter(_flatten_dense_tensors([p.data for p in model_params]).float())
        flat.grad = flat.new_zeros(flat.size())
        return model_params, [flat]
    master_params = [p.detach().clone().float().requires_grad_(True) for p in model_params]
    return model_params, master_params


def model_grads_to_master_grads(model_params: List[torch.Tensor], master_params: List[torch.Tensor],
                                flat_master: bool = False) -> None:
    """Copy model grads into the fp32 master grads (a missing model grad leaves the master's None)."""
    if flat_master:
        master_params[0].grad.data.copy_(_flatten_dense_tensors([p.grad.data for p in model_params]))
        return
    for model, master in zip(model_params, master_params):
        if model.grad is None:
            master.grad = None
        elif master.grad is None:
            master.grad = model.grad.detach().to(torch.float32, copy=True)  # its own memory, as apex's
        else:
            master.grad.data.copy_(model.grad.data)


def master_params_to_model_params(model_params: List[torch.Tensor], master_params: List[torch.Tensor],
                                  flat_master: bool = False) -> None:
    """Copy the fp32 master values back into the model params."""
    if flat_master:
        for model, master in zip(model_params,
                                 _unflatten_dense_tensors(master_params[0].data, [p.data for p in model_params])):
            model.data.copy_(master)
        return
    for model, master in zip(model_params, master_params):
        model.data.copy_(master.data)


def to_python_float(t: Any) -> float:
    """`t.item()` for a tensor (or anything with .item), else `t[0]`."""
    if hasattr(t, "item"):
        return t.item()
    return t[0]
