"""The device type a script trains on, as autocast and GradScaler need it.

"cuda" when the script names CUDA literally (`.cuda()`, `.to("cuda")`, `device="cuda:0"`,
`torch.device("cuda")`) and nothing else; "cpu" when it never touches a device at all and builds its
models itself (torch's modules, its own classes); otherwise (`.to(args.device)`, `torch.device(name)`,
`torch.cuda.is_available()` choices, a model made by another module's `create_model(opt)`, which may
well move it to the GPU) the device is only known at run time, and the migrated script reads it from
the model's parameters instead of guessing.
"""
from __future__ import annotations

import ast
from typing import Optional

import libcst as cst
from libcst.metadata import QualifiedNameSource

from apexlite.migrate.analysis import Analysis, dotted_text

CUDA = "cuda"
CPU = "cpu"
RUNTIME = "runtime"
_DTYPE_NAMES = {"float", "half", "double", "bfloat16", "float16", "float32", "float64", "int", "long", "bool",
                "int8", "uint8", "int16", "int32", "int64", "complex64", "complex128", "cfloat"}


def _literal(analysis: Analysis, node: cst.BaseExpression) -> Optional[object]:
    try:
        return ast.literal_eval(analysis.code(node).strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _kind_of_device_argument(analysis: Analysis, node: cst.BaseExpression) -> str:
    """cuda / cpu for a literal device (a string or torch.device("...")), runtime for anything else."""
    value = _literal(analysis, node)
    if isinstance(value, str):
        return CUDA if value.startswith(CUDA) else CPU
    if isinstance(value, int):  # `.to(0)`: a CUDA ordinal
        return CUDA
    if isinstance(node, cst.Call) and dotted_text(node.func) in ("torch.device", "device") and node.args:
        return _kind_of_device_argument(analysis, node.args[0].value)
    return RUNTIME


def _is_dtype(analysis: Analysis, node: cst.BaseExpression) -> bool:
    text = dotted_text(node)
    return text is not None and text.split(".")[-1] in _DTYPE_NAMES


def detect(analysis: Analysis) -> str:
    """CUDA, CPU or RUNTIME for the whole script."""
    kinds = set()
    for call in analysis.walk(analysis.module, cst.Call):
        func = call.func
        name = dotted_text(func) or ""
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda":
            kinds.add(CUDA)
        elif name.endswith("cuda.is_available"):
            kinds.add(RUNTIME)
        elif name == "torch.device" and call.args:
            kinds.add(_kind_of_device_argument(analysis, call.args[0].value))
        elif isinstance(func, cst.Attribute) and func.attr.value == "to":
            for arg in call.args:
                if arg.keyword is not None and arg.keyword.value == "device":
                    kinds.add(_kind_of_device_argument(analysis, arg.value))
                elif arg.keyword is None and arg is call.args[0] and not _is_dtype(analysis, arg.value):
                    kinds.add(_kind_of_device_argument(analysis, arg.value))
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "device":
                kinds.add(_kind_of_device_argument(analysis, arg.value))
    if RUNTIME in kinds or len(kinds - {CPU}) > 1 or (CUDA in kinds and CPU in kinds):
        return RUNTIME
    return CUDA if CUDA in kinds else CPU


_KNOWN_ROOTS = ("torch", "apex")  # constructors that leave a model where it was built (on the CPU)


def built_here(analysis: Analysis, model: cst.BaseExpression) -> bool:
    """Whether every assignment to `model`'s name in the script builds it from torch (or apex) or from a
    class or function the script defines, so that a script naming no device trains on the CPU."""
    text = dotted_text(model)
    if text is None:
        return False
    found = False
    for target in analysis.walk(analysis.module, cst.AssignTarget):
        parts = target.target.elements if isinstance(target.target, (cst.Tuple, cst.List)) else None
        names = [dotted_text(part.value) for part in parts] if parts is not None else [dotted_text(target.target)]
        if text not in names:
            continue
        statement = analysis.parent(target)
        value = statement.value if isinstance(statement, cst.Assign) else None
        if parts is not None:
            if not (isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(parts)):
                continue  # `model, optimizer = amp.initialize(...)` and the like: judged by the other assignments
            value = value.elements[names.index(text)].value
        if not _known_constructor(analysis, value, text):
            return False
        found = True
    return found


def _known_constructor(analysis: Analysis, value: cst.BaseExpression, text: str) -> bool:
    if not isinstance(value, cst.Call):
        return dotted_text(value) == text
    func = value.func
    if isinstance(func, cst.Attribute) and dotted_text(func.value) == text:  # model = model.float()
        return True
    qualified = analysis.qualified_names(func)
    return bool(qualified) and all(
        name.name.split(".")[0] in _KNOWN_ROOTS or (name.source is QualifiedNameSource.LOCAL and "." not in name.name
                                                    and _defined_here(analysis, name.name))
        for name in qualified)


def _defined_here(analysis: Analysis, name: str) -> bool:
    return any(isinstance(statement, (cst.ClassDef, cst.FunctionDef)) and statement.name.value == name
               for statement in analysis.module.body)
