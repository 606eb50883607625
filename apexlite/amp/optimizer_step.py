"""How amp reaches an optimizer's step: replaced only where apex replaced it, torch's step hooks elsewhere.

apex replaced `optimizer.step` for master weights (O2) and for O1's patched torch functions (the
update runs with casts off), and left the step the optimizer's class defines at O0 and O3. An LR
scheduler wraps `optimizer.step` when it is built; torch warns ("optimizer.step() has been overridden
after learning rate scheduler initialization") when the step it finds later is not its wrapper.
apexlite replaces the step at the same levels (a method bound to the optimizer, so a scheduler built
afterwards can wrap it) and uses the optimizer's own step hooks elsewhere, so schedulers warn exactly
when they did with apex. A step after an overflow is skipped as apex skipped it: a one-shot
replacement of `optimizer.step` that puts back whatever was there when it is called.
"""
from __future__ import annotations

import types
from collections import OrderedDict
from typing import Any, Callable, Optional

_MISSING = object()


def amp_step(optimizer: Any, closure: Any = None, *args: Any, **kwargs: Any) -> Any:
    """The step apexlite binds to an optimizer; the optimizer's AmpOptimizer (`_amp_stash`) runs it.

    A plain function taking the optimizer first, so that torch's LR schedulers, which re-bind the
    underlying function of `optimizer.step` to the optimizer, call it correctly.
    """
    return optimizer._amp_stash.step_call(closure, args, kwargs)


def bind_amp_step(optimizer: Any) -> types.MethodType:
    """`amp_step` bound to `optimizer`, ready to become its `step` attribute."""
    return types.MethodType(amp_step, optimizer)


def has_step_hooks(optimizer: Any) -> bool:
    """True for torch.optim.Optimizer instances (their class's step runs registered step hooks)."""
    return callable(getattr(optimizer, "register_step_pre_hook", None)) and callable(
        getattr(optimizer, "register_step_post_hook", None))


def register_first_post_hook(optimizer: Any, hook: Callable[..., None]) -> Optional[Any]:
    """Register `hook` to run first among the optimizer's step post-hooks (torch runs the optimizer's
    own before the global ones), so no other post-hook can raise before it. Returns the handle, or
    None for an optimizer without step hooks."""
    if not has_step_hooks(optimizer):
        return None
    handle = optimizer.register_step_post_hook(hook)
    registered = getattr(optimizer, "_optimizer_step_post_hooks", None)
    if isinstance(registered, OrderedDict) and handle.id in registered:
        registered.move_to_end(handle.id, last=False)
    return handle


def replaces_step(optimizer: Any, has_masters: bool, casts_active: bool) -> bool:
    """Whether amp replaces `optimizer.step` (apex did for master weights and O1) rather than hooking it.

    Optimizer wrappers that are not torch optimizers (no step hooks) get the replacement as well.
    """
    return has_masters or casts_active or not has_step_hooks(optimizer)


class OneShotSkip:
    """After an overflow, `optimizer.step` is a skip until it is called once; then what was there returns."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self._method: Optional[types.MethodType] = None
        self._previous: Any = _MISSING

    @property
    def installed(self) -> bool:
        return self._method is not None

    def install(self) -> None:
        """Make the next `optimizer.step()` go through `amp_step` (which skips while a skip is pending)."""
        if self._method is not None:
            return
        self._previous = vars(self.optimizer).get("step", _MISSING)
        self._method = bind_amp_step(self.optimizer)
        self.optimizer.step = self._method

    def remove(self) -> None:
        """Put back the step attribute from before `install`, unless something replaced ours meanwhile."""
        if self._method is None:
            return
        if vars(self.optimizer).get("step") is self._method:
            if self._previous is _MISSING:
                del self.optimizer.step
            else:
                self.optimizer.step = self._previous
        self._method = None

    def step_beneath(self) -> Callable[..., Any]:
        """The step that the skip stood in front of (an instance attribute then, or the class's step)."""
        if self._previous is not _MISSING:
            return self._previous
        return types.MethodType(type(self.optimizer).step, self.optimizer)
