"""TorchScript under O1: torch.jit.script and torch.jit.trace give plain torch's program.

NOTE [TorchScript]
TorchScript code cannot call O1's Python wrappers, and a traced graph outlives the session (and the
cache's cast copies, which a trace would freeze into constants), so O1 is off inside both:
- script: each wrapper of a torch builtin is registered as the same ATen builtin TorchScript maps the
  original to, so scripted code calls `aten::mm` where eager code calls the patched `torch.mm`; a
  wrapped Python-level function (F.softmax) is compiled from the original's source, as before.
  Scripting a model passed to `initialize` scripts it without apexlite's own forward hooks (they keep
  the cast cache's lifetime, which scripted code does not use): torch.jit.script is patched to hand
  TorchScript a copy of the module tree whose hook tables leave them out; the model itself is untouched.
- trace: every wrapper passes calls straight through while torch.jit traces (wrappers.py), so the
  graph holds the ops plain torch runs; torch.jit.trace and trace_module are patched to run with the
  calling thread's casts off, so the eager run that checks the trace computes what the graph does.
A scripted or traced module runs in fp32 as plain torch would; for mixed precision inside TorchScript,
use torch.autocast there. The eager model keeps its O1 casts.
"""
from __future__ import annotations

import collections
import sys
from typing import Any, Callable

import torch

from apexlite.amp.o1.function_wrappers import make_function_wrapper
from apexlite.amp.o1.patcher import Patcher

HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks")
HOOK_OPTION_TABLES = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def register_script_builtin(patcher: Patcher, original: Callable, wrapper: Any, qualname: str) -> None:
    """Make TorchScript compile calls of `wrapper` as the ATen builtin `original` stands for, if any."""
    builtins = getattr(torch.jit, "_builtins", None)
    find = getattr(builtins, "_find_builtin", None)
    table_of = getattr(builtins, "_get_builtin_table", None)
    if find is None or table_of is None:
        return
    op = find(original)
    if op is None:
        return
    table = table_of()
    table[id(wrapper)] = op
    patcher.add_undo(lambda: table.pop(id(wrapper), None), f"TorchScript builtin {op} for the O1 wrapper of {qualname}")


def _is_apexlite_hook(hook: Any) -> bool:
    module = getattr(hook, "__module__", None) or type(hook).__module__
    return module == "apexlite" or module.startswith("apexlite.")


def _has_apexlite_hooks(module: torch.nn.Module) -> bool:
    return any(_is_apexlite_hook(hook) for sub in module.modules() for table in HOOK_TABLES
               for hook in getattr(sub, table, {}).values())


def _without_apexlite_hooks(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of the module tree sharing every attribute, parameter and buffer, whose hook tables leave
    out apexlite's hooks (new dicts: the original modules are not touched)."""
    if isinstance(module, torch.jit.ScriptModule):
        return module
    clone = type(module).__new__(type(module))
    clone.__dict__.update(module.__dict__)
    for table in HOOK_TABLES:
        hooks = getattr(module, table, None)
        if hooks is not None:
            clone.__dict__[table] = collections.OrderedDict(
                (key, hook) for key, hook in hooks.items() if not _is_apexlite_hook(hook))
    kept = set(clone.__dict__.get("_forward_hooks", {})) | set(clone.__dict__.get("_forward_pre_hooks", {}))
    for table in HOOK_OPTION_TABLES:
        options = getattr(module, table, None)
        if options is not None:
            clone.__dict__[table] = type(options)((key, value) for key, value in options.items() if key in kept)
    clone.__dict__["_modules"] = {name: None if child is None else _without_apexlite_hooks(child)
                                  for name, child in module._modules.items()}
    return clone


def _frames_added() -> int:
    """How many frames stand between the caller of the patched torch.jit.script and torch's own: `_script`'s,
    and wrapt's where it runs in Python."""
    frame = sys._getframe(1)
    added = 0
    while frame is not None and frame.f_globals.get("__name__", "").startswith((__name__, "wrapt")):
        added += 1
        frame = frame.f_back
    return added


def _script(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    """torch.jit.script, given a hook-free copy of a module that carries apexlite's hooks. A scripted class
    resolves its names in the frame `_frames_up` counts from torch's script; it counts past this wrapper."""
    if args and isinstance(args[0], torch.nn.Module) and _has_apexlite_hooks(args[0]):
        args = (_without_apexlite_hooks(args[0]),) + tuple(args[1:])
    elif isinstance(kwargs.get("obj"), torch.nn.Module) and _has_apexlite_hooks(kwargs["obj"]):
        kwargs = dict(kwargs, obj=_without_apexlite_hooks(kwargs["obj"]))
    if len(args) > 2:
        args = args[:2] + (args[2] + _frames_added(),) + args[3:]
    else:
        kwargs = dict(kwargs, _frames_up=kwargs.get("_frames_up", 0) + _frames_added())
    return wrapped(*args, **kwargs)


def patch_torch_jit(patcher: Patcher, state: Any) -> None:
    """Patch torch.jit.script, trace and trace_module as NOTE [TorchScript] says (recorded in `patcher`)."""
    def casts_off(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        with state.disabled():
            return wrapped(*args, **kwargs)

    for name, wrapper in (("script", _script), ("trace", casts_off), ("trace_module", casts_off)):
        patched = make_function_wrapper(getattr(torch.jit, name), wrapper, (torch.jit, name))
        patcher.set_attribute(torch.jit, name, patched)
