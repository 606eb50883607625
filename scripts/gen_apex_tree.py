"""Generate apexlite/compat/apex_tree.tsv, the table of apex's module tree, from apex's source.

    python scripts/gen_apex_tree.py APEX_SRC [--python PROBE_PYTHON] [--out PATH]

APEX_SRC is a checkout of apex (the folder holding `apex/` and `csrc/`; apexlite's table is made from
commit e13873de, the last with amp). Rows:
- every module of the `apex` package: each .py file under APEX_SRC/apex except apex's own tests,
  examples and build helpers (folders named test, tests, *_tests, examples or csrc, and files named
  test.py or test_*.py). Its `apex` column says whether apex imports it "python-only" on CPU (its
  sources first on sys.path, no compiled extension built; torch and numpy installed in PROBE_PYTHON):
  `imports`, or the exception text it raised. Each module is imported in its own forked process
  (scripts/apex_tree_probe.py), so import side effects do not leak from one module into the next;
- every public name each module defines, read from its source with `ast`: functions, classes and
  top-level assignments (also inside top-level if/try blocks), the names in `__all__`, names imported
  from inside apex (private ones too in a package's `__init__`) and names bound by imports inside
  top-level try blocks (apex's fallbacks). Where the module imports, the probe gives the name's
  runtime kind (class / function / object / constant / submodule) and, for a re-export, the row it is
  `same_as`; an empty `apex` column on a name means "as its module". A name that is also a submodule
  path has the module's row; when the package binds an object there instead (apex.amp._amp_state),
  that row's `same_as` names the object;
- every top-level module apex's setup.py builds as a compiled extension (`CUDAExtension(name=...)` /
  `CppExtension(...)`: amp_C, fused_layer_norm_cuda, syncbn, apex_C, ...), probed like the rest (python-only,
  each is a ModuleNotFoundError), and its functions: the `m.def("...")` names in its C++/CUDA sources.
Module paths and names are facts read from the source; no code is copied.

It then rewrites MIGRATION.md's module table (between its "apex tree" markers) from the table;
`--migration-only` does just that, from the committed table.

Re-running keeps apexlite's own columns (status, note) for every row that still exists, keeps the
hand-written rows (an `apex` column starting with "absent at" or "apexlite only": names apexlite provides
for other apex releases, or adds), and gives every new row the status `new`, which
tests/compat/test_apex_tree.py refuses until someone decides it. Rows that disappeared are listed on stderr.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "apexlite" / "compat" / "apex_tree.tsv"
MIGRATION = ROOT / "MIGRATION.md"
PROBE = Path(__file__).resolve().with_name("apex_tree_probe.py")
COLUMNS = ("name", "kind", "apex", "status", "same_as", "note")
KEPT_COLUMNS = ("status", "note")
HAND_WRITTEN = ("absent at", "apexlite only")
NEW = "new"
_SKIPPED_DIRS = re.compile(r"^(tests?|.*_tests|examples|csrc)$")
_SKIPPED_FILES = re.compile(r"^test(_.*)?\.py$")
_PYBIND_DEF = re.compile(r'm\.def\(\s*"(\w+)"')

Binding = Tuple[str, Optional[str]]  # (ast kind, origin "apex.x.y.name" for a name imported from inside apex)


def discover_modules(apex_src: Path) -> Dict[str, Path]:
    """Dotted module name -> source file, for every module of the apex package (see the docstring)."""
    modules = {}
    for path in sorted((apex_src / "apex").rglob("*.py")):
        relative = path.relative_to(apex_src)
        if any(_SKIPPED_DIRS.match(part) for part in relative.parts[:-1]) or _SKIPPED_FILES.match(path.name):
            continue
        parts = list(relative.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> Optional[str]:
    """The apex module an ImportFrom reads from, or None when it is outside apex."""
    if node.level == 0:
        name = node.module or ""
        return name if name == "apex" or name.startswith("apex.") else None
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Bindings:
    """The names one module binds at top level, with where each came from."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.module, self.is_package = module, is_package
        self.names: Dict[str, Binding] = {}
        self.all: List[str] = []
        self.stars: List[str] = []

    def visit(self, body: List[ast.stmt], in_try: bool = False) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.names.setdefault(node.name, ("function", None))
            elif isinstance(node, ast.ClassDef):
                self.names.setdefault(node.name, ("class", None))
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                self._assignment(node)
            elif isinstance(node, ast.ImportFrom):
                self._import_from(node, in_try)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name.split(".")[0] == "apex":
                        self.names.setdefault(alias.asname, ("submodule", alias.name))
            elif isinstance(node, ast.If):
                self.visit(node.body, in_try)
                self.visit(node.orelse, in_try)
            elif isinstance(node, ast.Try):
                self.visit(node.body, True)
                for handler in node.handlers:
                    self.visit(handler.body, True)
                self.visit(node.orelse, True)
                self.visit(node.finalbody, in_try)
            elif isinstance(node, ast.With):
                self.visit(node.body, in_try)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                self._all_append(node.value)

    def _assignment(self, node: ast.stmt) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if not isinstance(element, ast.Name):
                    continue
                if element.id == "__all__" and isinstance(getattr(node, "value", None), (ast.List, ast.Tuple)):
                    self.all += [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
                elif not isinstance(node, ast.AugAssign):
                    self.names.setdefault(element.id, ("constant", None))

    def _all_append(self, call: ast.Call) -> None:
        func = call.func
        if (isinstance(func, ast.Attribute) and func.attr in ("append", "extend")
                and isinstance(func.value, ast.Name) and func.value.id == "__all__"):
            for arg in call.args:
                values = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
                self.all += [v.value for v in values if isinstance(v, ast.Constant)]

    def _import_from(self, node: ast.ImportFrom, in_try: bool) -> None:
        source = _absolute(self.module, self.is_package, node)
        if source is None and not in_try:
            return  # torch, typing, ...: not apex's API
        for alias in node.names:
            if alias.name == "*":
                if source is not None:
                    self.stars.append(source)
                continue
            origin = f"{source}.{alias.name}" if source is not None else None
            self.names.setdefault(alias.asname or alias.name, ("import", origin))

    def public(self) -> Dict[str, Binding]:
        """Public names; private ones only when listed in __all__ or re-exported by a package from apex."""
        return {name: binding for name, binding in self.names.items()
                if not name.startswith("_") or name in self.all
                or (self.is_package and binding[1] is not None and name != "_")}


def read_bindings(modules: Dict[str, Path]) -> Dict[str, Dict[str, Binding]]:
    """module -> its public names (star imports of other apex modules expanded)."""
    parsed = {}
    for module, path in modules.items():
        bindings = _Bindings(module, path.name == "__init__.py")
        bindings.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)).body)
        parsed[module] = bindings
    result = {module: bindings.public() for module, bindings in parsed.items()}
    for module, bindings in parsed.items():
        for source in bindings.stars:
            exported = parsed[source].all or list(result.get(source, {}))
            for name in exported:
                result[module].setdefault(name, ("import", f"{source}.{name}"))
    return result


def _extension_calls(setup: ast.Module):
    """(name, sources expression) of every CUDAExtension/CppExtension call in apex's setup.py."""
    for node in ast.walk(setup):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("CUDAExtension", "CppExtension"):
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            name = keywords.get("name", node.args[0] if node.args else None)
            sources = keywords.get("sources", node.args[1] if len(node.args) > 1 else None)
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                yield name.value, sources


def extensions(apex_src: Path) -> Dict[str, List[str]]:
    """Top-level extension module -> the functions its C++/CUDA sources define (their pybind `m.def` names).

    The sources are the string literals of the extension's `sources` argument, glob patterns expanded."""
    found: Dict[str, List[str]] = {}
    for name, sources in _extension_calls(ast.parse((apex_src / "setup.py").read_text(encoding="utf-8"))):
        patterns = [node.value for node in (ast.walk(sources) if sources is not None else ())
                    if isinstance(node, ast.Constant) and isinstance(node.value, str)]
        files = sorted({path for pattern in patterns for path in apex_src.glob(pattern)
                        if path.suffix in (".cpp", ".cu")})
        functions = {function for path in files for function in _PYBIND_DEF.findall(
            path.read_text(encoding="utf-8", errors="replace"))}
        found[name] = sorted(set(found.get(name, [])) | functions)
    return found


def probe(apex_src: Path, modules: List[str], python: str, jobs: int) -> Dict[str, dict]:
    """What python-only apex does on import of each module (see scripts/apex_tree_probe.py)."""
    result = subprocess.run([python, str(PROBE), str(apex_src), str(jobs)], input=json.dumps(modules), text=True,
                            capture_output=True, check=True, timeout=3600)
    return json.loads(result.stdout)


def _canonical(rows: Dict[str, Dict[str, str]], name: str) -> str:
    seen = set()
    while rows.get(name, {}).get("same_as") and name not in seen:
        seen.add(name)
        name = rows[name]["same_as"]
    return name


def build_rows(modules: Dict[str, Path], compiled: Dict[str, List[str]],
               report: Dict[str, dict]) -> Dict[str, Dict[str, str]]:
    """name -> row (without apexlite's columns) for every module, public name, extension module and its functions."""
    rows: Dict[str, Dict[str, str]] = {}
    for module, path in modules.items():
        outcome = report[module]
        rows[module] = {"name": module, "kind": "package" if path.name == "__init__.py" else "module",
                        "apex": "imports" if "names" in outcome else outcome["error"], "same_as": ""}
    origins: Dict[str, Optional[str]] = {}
    for module, names in read_bindings(modules).items():
        runtime = report[module].get("names")
        for name, (kind, origin) in sorted(names.items()):
            full = f"{module}.{name}"
            if full in rows:  # also a submodule path: the module row stands for both
                bound = runtime.get(name) if runtime is not None else None
                if bound is not None and bound[0] != "submodule":
                    rows[full]["same_as"] = bound[1] or origin or ""  # the package binds an object there
                continue
            apex = ""
            if runtime is not None and name in runtime:
                kind, runtime_origin = runtime[name]
                origin = runtime_origin or origin  # where the object really comes from beats the first import
            elif runtime is not None:
                apex = "not bound when the module is imported"
            rows[full] = {"name": full, "kind": kind, "apex": apex, "same_as": ""}
            origins[full] = origin
    for full, origin in origins.items():
        if origin and origin in rows and origin != full:
            rows[full]["same_as"] = origin
    targets = {full: _canonical(rows, full) for full in origins}
    for full, target in targets.items():
        rows[full]["same_as"] = "" if target == full else target
    for full, target in targets.items():
        target_kind = rows[target]["kind"] if target != full else "name"
        if rows[full]["kind"] == "import":
            rows[full]["kind"] = {"module": "submodule", "package": "submodule", "import": "name"}.get(
                target_kind, target_kind)
    for extension, functions in compiled.items():
        rows[extension] = {"name": extension, "kind": "module", "apex": report[extension].get("error", "imports"),
                           "same_as": ""}
        for function in functions:
            full = f"{extension}.{function}"
            rows[full] = {"name": full, "kind": "function", "apex": "", "same_as": ""}
    return rows


def read_table(path: Path) -> Dict[str, Dict[str, str]]:
    """name -> row of an existing table (empty when there is none)."""
    if not path.exists():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    return {cells[0]: dict(zip(header, cells)) for cells in (line.split("\t") for line in lines[1:] if line)}


def merge(generated: Dict[str, Dict[str, str]], old: Dict[str, Dict[str, str]]) -> Tuple[List[dict], List[str]]:
    """(rows to write, names of old generated rows that no longer exist)."""
    merged = {}
    for name, row in generated.items():
        kept = old.get(name, {})
        merged[name] = {**row, **{column: kept.get(column, "") for column in KEPT_COLUMNS}}
        if name not in old:
            merged[name]["status"] = NEW
    dropped = []
    for name, row in old.items():
        if name in merged:
            continue
        if row.get("apex", "").startswith(HAND_WRITTEN):
            merged[name] = row
        else:
            dropped.append(name)
    return [merged[name] for name in sorted(merged)], dropped


def write_table(path: Path, rows: List[dict]) -> None:
    for row in rows:
        for column in COLUMNS:
            if any(ch in row.get(column, "") for ch in "\t\n\r"):
                raise ValueError(f"{row['name']}: a tab or newline in its {column} column")
    lines = ["\t".join(COLUMNS)] + ["\t".join(row.get(column, "") for column in COLUMNS) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def load_tree_module() -> Any:
    """apexlite/compat/apex_tree.py, loaded from its file (it needs no torch, unlike the apexlite package)."""
    spec = importlib.util.spec_from_file_location("apex_tree", ROOT / "apexlite" / "compat" / "apex_tree.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def write_migration(path: Path, table: Path) -> None:
    """Replace the module table between the markers in MIGRATION.md with one made from `table`."""
    apex_tree = load_tree_module()
    tree = apex_tree.Tree(apex_tree.parse(table.read_text(encoding="utf-8")))
    text = path.read_text(encoding="utf-8")
    start, end = text.index(apex_tree.SECTION_BEGIN), text.index(apex_tree.SECTION_END) + len(apex_tree.SECTION_END)
    path.write_text(text[:start] + apex_tree.module_table_section(tree) + text[end:], encoding="utf-8")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("apex_src", type=Path, nargs="?", help="folder holding apex's apex/ and csrc/")
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch (and numpy) for the probe")
    parser.add_argument("--jobs", type=int, default=4, help="modules imported at a time (default 4)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"table to write (default {DEFAULT_OUT})")
    parser.add_argument("--migration", type=Path, help="MIGRATION.md whose module table to rewrite (default: "
                        "apexlite's, when writing apexlite's table)")
    parser.add_argument("--migration-only", action="store_true", help="only rewrite MIGRATION.md's module table")
    args = parser.parse_args(argv)
    if args.migration is None and args.out.resolve() == DEFAULT_OUT:
        args.migration = MIGRATION
    if args.migration_only:
        if args.migration is None:
            parser.error("--migration-only with another table needs --migration")
        write_migration(args.migration, args.out)
        return 0
    if args.apex_src is None:
        parser.error("APEX_SRC is needed (or --migration-only)")
    modules = discover_modules(args.apex_src)
    compiled = extensions(args.apex_src)
    report = probe(args.apex_src, sorted(modules) + sorted(compiled), args.python, args.jobs)
    rows, dropped = merge(build_rows(modules, compiled, report), read_table(args.out))
    write_table(args.out, rows)
    if args.migration is not None:
        write_migration(args.migration, args.out)
    new = sum(row["status"] == NEW for row in rows)
    print(f"{args.out}: {len(rows)} rows ({len(modules)} apex modules, {len(compiled)} extension modules), {new} "
          "new; probed with "
          f"torch {report['__environment__']['torch']}", file=sys.stderr)
    for name in dropped:
        print(f"dropped (no longer in apex's source): {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
