"""What apexlite's optimizers share with apex's: `set_grad_none` as zero_grad's default, closures, and
the attributes apex's optimizers created for their kernels (subclasses written against apex read them)."""
from __future__ import annotations

import functools
import numbers
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch


def clear_grads(params: Iterable[torch.Tensor], set_to_none: bool, foreach: bool) -> None:
    """torch.optim.Optimizer.zero_grad's rule for ``params``: drop each grad, or detach it and zero it in place
    (one foreach call per device and dtype when ``foreach``)."""
    batches: dict = {}
    for param in params:
        grad = param.grad
        if grad is None:
            continue
        if set_to_none:
            param.grad = None
            continue
        if grad.grad_fn is not None:
            grad.detach_()
        else:
            grad.requires_grad_(False)
        if foreach and not grad.is_sparse:
            batches.setdefault((grad.device, grad.dtype), []).append(grad)
        else:
            grad.zero_()
    for grads in batches.values():
        torch._foreach_zero_(grads)


def check_numbers(owner: str, tensors: bool = False, **values: Any) -> None:
    """Each keyword is a real number, not NaN (a value read from a config file or a command line is a str); with
    `tensors`, a one-element tensor is taken too (an lr schedule under torch.compile keeps lr in one)."""
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            if tensors and value.numel() == 1:
                continue
            raise TypeError(f"{owner} takes {name} as a Python float; pass float({name}) (a tensor is not supported).")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
            raise TypeError(f"{owner} takes {name} as a number, got {type(value).__name__} {value!r}; pass "
                            f"float({name}) (a value read from a config file or the command line is a str)")


def check_hyper(lr: Any, betas: Any, eps: Any, weight_decay: Any, owner: str) -> None:
    """The constructor's checks of a group's hyper-parameters, with messages that say the valid range."""
    check_numbers(owner, lr=lr, eps=eps, weight_decay=weight_decay)
    if not isinstance(betas, (tuple, list)) or not all(isinstance(b, numbers.Real) for b in betas):
        raise TypeError(f"{owner} takes betas as a pair of numbers, (beta1, beta2), got {betas!r}")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr} (must be >= 0)")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps} (must be >= 0)")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"Invalid betas: {betas} (need two values, each in [0, 1))")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay} (must be >= 0)")


@functools.lru_cache(maxsize=None)
def _torch_attributes() -> frozenset:
    """The attributes torch.optim.Optimizer itself sets (its pickled state, and the hooks it makes anew)."""
    return frozenset(torch.optim.Optimizer([torch.zeros(1, requires_grad=True)], {}).__dict__)


class ApexStyleOptimizer(torch.optim.Optimizer):
    """A torch Optimizer whose `zero_grad()` defaults to the constructor's `set_grad_none`, and whose copies
    (`copy.deepcopy`, pickle) keep its own attributes: torch's keep only defaults, state and param_groups."""

    set_grad_none: bool = True
    float32_state: bool = False  # every floating state tensor is float32, whatever the param's dtype

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """torch's load, except that an optimizer with ``float32_state`` keeps its state in float32: torch casts
        state to each param's dtype, which for a float16 param turns an Adagrad sum of squares into inf."""
        super().load_state_dict(state_dict)
        if not self.float32_state:
            return
        ids = [pid for group in state_dict["param_groups"] for pid in group["params"]]
        by_id = dict(zip(ids, (p for group in self.param_groups for p in group["params"])))
        for pid, saved in state_dict["state"].items():
            param = by_id.get(pid)
            for key, value in saved.items() if param is not None else ():
                if key != "step" and torch.is_tensor(value) and value.is_floating_point():
                    self.state[param][key] = value.to(device=param.device, dtype=torch.float32, copy=True)

    def __getstate__(self) -> Dict[str, Any]:
        own = {key: value for key, value in self.__dict__.items()
               if key not in _torch_attributes() and key not in self._caches()}
        return {**super().__getstate__(), **own}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        had_flag = "differentiable" in state.get("defaults", getattr(self, "defaults", {}))
        super().__setstate__(state)  # (torch's load_state_dict calls it too, on a live optimizer: caches stay)
        if not had_flag:  # torch adds `differentiable` to the defaults, and its load to each group: not ours
            self.defaults.pop("differentiable", None)
            for group in self.param_groups:
                if group.get("differentiable") is False:
                    del group["differentiable"]
        if not all(name in self.__dict__ for name in self._caches()):
            self._make_caches()

    def _caches(self) -> Tuple[str, ...]:
        """Attributes a copy leaves out and `_make_caches` builds anew (buffers tied to the original's tensors)."""
        return ()

    def _make_caches(self) -> None:
        """Builds the attributes `_caches` names."""

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Clears gradients; ``set_to_none`` defaults to the constructor's ``set_grad_none``."""
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    def _make_overflow_buf(self) -> None:
        """apex's ``_dummy_overflow_buf``: the int32 no-op flag its kernels take, on the first param's device."""
        params = [p for group in self.param_groups for p in group["params"]]
        device = params[0].device if params else torch.device("cpu")
        self._dummy_overflow_buf = torch.tensor([0], dtype=torch.int, device=device)

    @staticmethod
    def _closure_loss(closure: Optional[Callable[[], Any]]) -> Any:
        """Re-evaluate the model with grad enabled when a closure is given (torch's step contract)."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()
