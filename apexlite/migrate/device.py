"""The device type a script trains on, as autocast and GradScaler need it.

"cuda" when the script names CUDA literally (`.cuda()`, `.to("cuda")`, `device="cuda:0"`,
`torch.device("cuda")`) and nothing else; "cpu" when it never touches a device at all; otherwise
(`.to(args.device)`, `torch.device(name)`, `torch.cuda.is_available()` choices) the device is only
known at run time, and the migrated script reads it from the model's parameters instead of guessing.
"""
from __future__ import annotations

import ast
from typing import Optional

import libcst as cst

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
