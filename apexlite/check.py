"""`python -m apexlite check SCRIPT`: which apex APIs a script uses and how apexlite handles each.

The script is parsed, never executed. Every `apex` / `amp_C` import is followed through aliases
(`from apex.parallel import DistributedDataParallel as DDP`, `import apex.amp as amp`, ...) to the
attribute uses in the code. Each API is then looked up in apexlite.compat: what resolves to a real
implementation is "supported" (or "differs: how", from the notes below); what resolves to a
placeholder, or to nothing, is "unsupported: alternative". Exit status 1 when anything is unsupported.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from apexlite.compat.hook import UNSUPPORTED_AREAS, target_name

_KERNEL = "differs: computed with torch ops (fp32 statistics) instead of apex's CUDA kernel; same results"
_TORCH_OPT = "differs: a torch implementation of apex's update rule, not a fused kernel; same results"
DIFFERENCES: Dict[str, str] = {
    "apex.amp.initialize": ("differs: models may live on any device; O1 patches an updated op list (see "
                            "MIGRATION.md); calling it twice needs amp.deinitialize(); APEXLITE_OPT_LEVEL / "
                            "APEXLITE_DTYPE may override opt_level and the fp16 dtype"),
    "apex.amp.disable_casts": "differs: casts are restored even when the block raises",
    "apex.amp.load_state_dict": "differs: also accepts a torch.amp.GradScaler state dict",
    "apex.amp.init": ("unsupported: the pre-2019 handle API (only enabled=False works, returning a no-op "
                      "handle); use amp.initialize(model, optimizer, opt_level='O1')"),
    "apex.optimizers.FusedSGD": _TORCH_OPT,
    "apex.optimizers.FusedLAMB": _TORCH_OPT,
    "apex.optimizers.FusedNovoGrad": _TORCH_OPT,
    "apex.optimizers.FusedAdagrad": _TORCH_OPT,
    "apex.parallel.DistributedDataParallel": (
        "differs: built on torch DDP; delay_allreduce, allreduce_trigger_params, num_allreduce_streams, "
        "allreduce_communicators, retain_allreduce_buffers and prof only tuned overlap and are ignored (logged)"),
    "apex.parallel.SyncBatchNorm": "differs: torch.nn.SyncBatchNorm underneath; channel_last=True is refused "
                                   "(use torch.channels_last tensors)",
    "apex.parallel.convert_syncbn_model": "differs: channel_last=True is refused (use torch.channels_last tensors)",
    "apex.fp16_utils.FP16_Optimizer": "differs: messages go to the apexlite logger; inspect_master_grad_data "
                                      "is not provided",
    "apex.multi_tensor_apply.multi_tensor_applier": "differs: always available (torch foreach ops, any device)",
    "apex.normalization.FusedLayerNorm": _KERNEL,
    "apex.normalization.FusedRMSNorm": _KERNEL,
    "apex.normalization.MixedFusedLayerNorm": _KERNEL,
    "apex.normalization.MixedFusedRMSNorm": _KERNEL,
}
_AMP_C = "differs: torch foreach ops; chunk_size is accepted and unused"


@dataclass
class Usage:
    """One apex API and the lines that use it."""

    api: str
    lines: List[int] = field(default_factory=list)


class _ApexUses(ast.NodeVisitor):
    """Collects apex/amp_C APIs referenced by a module, resolving import aliases."""

    def __init__(self) -> None:
        self.aliases: Dict[str, str] = {}  # local name -> legacy qualified name
        self.uses: Dict[str, Usage] = {}

    def _record(self, api: str, line: int) -> None:
        self.uses.setdefault(api, Usage(api)).lines.append(line)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if target_name(alias.name) is None:
                continue
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top
            self._record(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or target_name(module) is None:
            return
        for alias in node.names:
            if alias.name == "*":
                self._record(module, node.lineno)
                exported = getattr(importlib.import_module(target_name(module)), "__all__", [])
                self.aliases.update({name: f"{module}.{name}" for name in exported})
                continue
            qualified = f"{module}.{alias.name}"
            self.aliases[alias.asname or alias.name] = qualified
            self._record(qualified, node.lineno)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain: List[str] = []
        current: ast.AST = node
        while isinstance(current, ast.Attribute):
            chain.append(current.attr)
            current = current.value
        if isinstance(current, ast.Name) and current.id in self.aliases:
            attrs = [attr for attr in reversed(chain)]
            while attrs and attrs[-1].startswith("__"):
                attrs.pop()  # `apex.__version__`, `amp.__name__`: the module itself is what is used
            self._record(".".join([self.aliases[current.id], *attrs]), node.lineno)
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.aliases and isinstance(node.ctx, ast.Load):
            self._record(self.aliases[node.id], node.lineno)


def _resolve(api: str) -> Tuple[str, Any]:
    """(the API name at the depth that matters, the compat object it resolves to or None).

    Attributes are followed from the top-level module down, importing a submodule only when no
    attribute of that name exists (as `import a.b` would); the walk stops at the first object that
    is not a module (`amp.initialize`, `amp._amp_state`), since deeper access is that object's API.
    """
    parts = api.split(".")
    obj: Any = importlib.import_module(target_name(parts[0]))
    for index in range(1, len(parts)):
        if not isinstance(obj, types.ModuleType):
            return ".".join(parts[:index]), obj
        attr = getattr(obj, parts[index], None)
        if attr is None:
            try:
                attr = importlib.import_module(target_name(".".join(parts[:index + 1])))
            except ImportError:
                return ".".join(parts[:index + 1]), None
        obj = attr
    return api, obj


def status_of(api: str) -> Tuple[str, str]:
    """(API name as reported, status text) for one legacy API."""
    parts = api.split(".")
    if parts[0] == "apex" and len(parts) > 1 and parts[1] in UNSUPPORTED_AREAS:
        return ".".join(parts[:3]), f"unsupported: {UNSUPPORTED_AREAS[parts[1]]}"
    name, obj = _resolve(api)
    if name in DIFFERENCES:
        return name, DIFFERENCES[name]
    if name.startswith("amp_C.") and obj is not None and not getattr(obj, "apexlite_unsupported", False):
        return name, _AMP_C
    if obj is None:
        return name, "unsupported: not part of apex's legacy API as apexlite provides it (check the spelling)"
    if getattr(obj, "apexlite_unsupported", False):
        return name, "unsupported: " + obj.__doc__.split(" is not supported by apexlite. ", 1)[-1]
    return name, "supported"


def scan(source: str, filename: str = "<script>") -> List[Tuple[str, List[int], str]]:
    """(api, line numbers, status) for every apex API used in `source`, sorted by first use."""
    visitor = _ApexUses()
    visitor.visit(ast.parse(source, filename))
    merged: Dict[str, Tuple[List[int], str]] = {}
    for usage in visitor.uses.values():
        name, status = status_of(usage.api)
        lines, _ = merged.get(name, ([], status))
        merged[name] = (sorted(set(lines + usage.lines)), status)
    return sorted(((name, lines, status) for name, (lines, status) in merged.items()), key=lambda r: r[1][0])


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite check`."""
    parser = argparse.ArgumentParser(prog="python -m apexlite check",
                                     description="List the apex APIs a script uses and their status in apexlite "
                                                 "(the script is read, not run).")
    parser.add_argument("script")
    args = parser.parse_args(argv)
    try:
        with open(args.script, encoding="utf-8") as handle:
            source = handle.read()
        rows = scan(source, args.script)
    except (OSError, SyntaxError) as error:
        sys.stderr.write(f"apexlite check: cannot read {args.script}: {error}\n")
        return 2
    if not rows:
        print(f"{args.script}: no apex APIs used")
        return 0
    width = max(len(name) for name, _, _ in rows)
    print(f"{args.script}: {len(rows)} apex APIs")
    for name, lines, status in rows:
        where = ",".join(str(line) for line in lines)
        print(f"  {name:{width}}  line {where}: {status}")
    unsupported = sum(status.startswith("unsupported") for _, _, status in rows)
    print(f"{len(rows) - unsupported} supported or supported with differences, {unsupported} unsupported")
    return 1 if unsupported else 0
