"""The programs in a set of files, by what imports what: which files `migrate` must read and judge together.

A program is a file and the modules it reaches through its imports. Files are read once with Python's
own parser (fast, and dropped at once) for their imports, whether they name apex, and their
amp.initialize calls; libcst reads only the files a migration can change. For each amp.initialize (a
"home"), its program is everything the files that reach it (itself included) reach; homes one file
reaches together are one program with several calls. Each program is migrated on its own, with:
  - the files naming apex that belong to it alone;
  - the files that connect them: an import away from one of them (a caller of a function that gets the
    GradScaler, a module that steps the optimizer), or reached from one and reaching another;
  - the files anywhere that import one of its apex files (callers migrate must see, or they would miss
    the GradScaler's argument).
A file naming apex that several programs share, or that no program with amp.initialize reaches, is
migrated alone, and its amp part says which amp.initialize calls (of its programs only) it could belong
to. So two unrelated projects in one tree never cite each other.
"""
from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

from apexlite.migrate import apis

Key = Path
Import = Tuple[int, Optional[str], Tuple[str, ...]]  # (relative level, module, names imported from it)


def mentions_apex(source: bytes) -> bool:
    """Whether any apex root can be named in `source`: an import of one needs its name in the text."""
    return any(root.encode() in source for root in apis.ROOTS)


@dataclass
class FileFacts:
    """What the grouping needs of one file, read with Python's parser."""

    imports: List[Import] = field(default_factory=list)
    apex: bool = False
    initialize_lines: List[int] = field(default_factory=list)


def _statements(tree: ast.Module) -> Iterable[ast.stmt]:
    """Every statement, through the bodies of compound statements only (imports are never expressions)."""
    stack: List[ast.stmt] = list(reversed(tree.body))
    while stack:
        statement = stack.pop()
        yield statement
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in reversed(getattr(statement, name, None) or ()):
                if isinstance(child, (ast.ExceptHandler, getattr(ast, "match_case", ast.ExceptHandler))):
                    stack.extend(reversed(child.body))
                elif isinstance(child, ast.stmt):
                    stack.append(child)


def _initialize_lines(tree: ast.Module, imports: List[ast.stmt]) -> List[int]:
    """Lines naming apex's amp.initialize (`amp.initialize`, `apex.amp.initialize`, an imported alias)."""
    modules, functions = {"apex.amp"}, set()
    for node in imports:
        if isinstance(node, ast.Import):
            modules.update(alias.asname for alias in node.names if alias.name == "apex.amp" and alias.asname)
        elif node.module == "apex" and not node.level:
            modules.update(alias.asname or alias.name for alias in node.names if alias.name == "amp")
        elif node.module in ("apex.amp", "apex.amp.frontend") and not node.level:
            functions.update(alias.asname or alias.name for alias in node.names if alias.name == "initialize")
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "initialize" and _dotted(node.value) in modules:
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in functions and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
    return sorted(lines)


def _dotted(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def python_tree(source: bytes) -> Optional[ast.Module]:
    """Python's syntax tree of `source`, None when Python cannot parse it."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def read_facts(source: bytes, tree: Optional[ast.Module] = None) -> Optional[FileFacts]:
    """The file's imports and amp.initialize lines (None when Python cannot parse it)."""
    tree = python_tree(source) if tree is None else tree
    if tree is None:
        return None
    facts = FileFacts(apex=mentions_apex(source))
    import_nodes = [node for node in _statements(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in import_nodes:
        if isinstance(node, ast.Import):
            facts.imports.extend((0, alias.name, ()) for alias in node.names)
        else:
            facts.imports.append((node.level, node.module, tuple(alias.name for alias in node.names)))
    if facts.apex and b"initialize" in source:
        facts.initialize_lines = _initialize_lines(tree, import_nodes)
    return facts


class ModuleIndex:
    """Which file a module name means, among the files given: a relative import by the importer's folder; an
    absolute one by the dotted path's ending (`models.train` is .../models/train.py or .../models/train/
    __init__.py), the file whose root folder is nearest above the importer when several fit (Python looks
    in the script's own folder first), none when that still leaves several."""

    def __init__(self, paths: Iterable[Key]) -> None:
        self.known: Set[Key] = set(paths)
        self.by_suffix: Dict[str, List[Key]] = {}
        for path in self.known:
            parts = list(path.with_suffix("").parts)
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            for start in range(len(parts)):
                self.by_suffix.setdefault(".".join(parts[start:]), []).append(path)

    def resolve(self, importer: Key, module: Optional[str], level: int) -> Optional[Key]:
        if level:
            base = importer.parent
            for _ in range(level - 1):
                base = base.parent
            target = base.joinpath(*module.split(".")) if module else base
            found = [path for path in (target.with_suffix(".py"), target / "__init__.py") if path in self.known]
            return found[0] if found else None
        if not module:
            return None
        matches = self.by_suffix.get(module, [])
        if len(matches) <= 1:
            return matches[0] if matches else None
        depth = module.count(".") + 1
        above = [(len(_root(path, depth).parts), path) for path in matches if _root(path, depth) in importer.parents]
        above.sort(reverse=True)
        if above and (len(above) == 1 or above[0][0] != above[1][0]):
            return above[0][1]
        return None

    def targets(self, importer: Key, imported: Import) -> List[Key]:
        """The files an import statement runs: the module, its packages' __init__ files, and the
        submodules a `from package import name` names."""
        level, module, names = imported
        found = []
        parts = (module or "").split(".") if module else []
        for depth in range(1, len(parts) + 1):
            path = self.resolve(importer, ".".join(parts[:depth]), level)
            if path is not None:
                found.append(path)
        if not parts and level:
            path = self.resolve(importer, None, level)
            if path is not None:
                found.append(path)
        for name in names:
            path = self.resolve(importer, f"{module}.{name}" if module else name, level)
            if path is not None:
                found.append(path)
        return found


def _root(path: Key, depth: int) -> Key:
    """The folder a module path of `depth` dotted parts starts in (for pkg/__init__.py, the package's parent)."""
    root = path.parent if path.name == "__init__.py" else path
    for _ in range(depth):
        root = root.parent
    return root


@dataclass
class Group:
    """Files migrated jointly: the one with amp.initialize (`home`, None for none) and the files it may reach;
    `initialize_calls`: the amp.initialize calls (file, line) of the programs, when this file stands for
    several or a program has several."""

    keys: List[Key]
    home: Optional[Key]
    initialize_calls: List[Tuple[Key, int]] = field(default_factory=list)


class ImportGraph:
    """The files' imports as edges importer -> imported, and the groups migrate reads them in."""

    def __init__(self, facts: Mapping[Key, FileFacts]) -> None:
        self.facts = facts
        index = ModuleIndex(facts)
        self.edges: Dict[Key, Set[Key]] = {key: set() for key in facts}
        self.back: Dict[Key, Set[Key]] = {key: set() for key in facts}
        for key, file_facts in facts.items():
            for imported in file_facts.imports:
                for target in index.targets(key, imported):
                    if target != key:
                        self.edges[key].add(target)
                        self.back[target].add(key)

    def _reach(self, starts: Iterable[Key], edges: Mapping[Key, Set[Key]], within: Optional[Set[Key]] = None) -> Set[Key]:
        seen = set(starts)
        queue = deque(seen)
        while queue:
            for other in edges[queue.popleft()]:
                if other not in seen and (within is None or other in within):
                    seen.add(other)
                    queue.append(other)
        return seen

    def groups(self) -> List[Group]:
        """Every file that names apex in exactly one group, with the files its program needs read beside it."""
        homes = [key for key, facts in self.facts.items() if facts.initialize_lines]
        entries = {home: self._reach([home], self.back) for home in homes}
        classes = _union([[a, b] for i, a in enumerate(homes) for b in homes[i + 1:] if entries[a] & entries[b]], homes)
        programs = [(members, self._reach(set().union(*(entries[home] for home in members)), self.edges))
                    for members in classes]
        apex = {key for key, facts in self.facts.items() if facts.apex}
        owners: Dict[Key, List[int]] = {}
        for number, (_, files) in enumerate(programs):
            for key in files & apex:
                owners.setdefault(key, []).append(number)
        groups: List[Group] = []
        claimed: Dict[Key, int] = {}
        for number, (members, files) in enumerate(programs):
            own = {key for key in files & apex if owners[key] == [number]}
            calls = [(home, line) for home in members for line in self.facts[home].initialize_lines]
            if len(calls) > 1:  # one program, several amp.initialize calls: each of its files alone
                groups.extend(Group([key], key if key in members else None, calls) for key in sorted(own))
                continue
            wanted = own | self._connecting(own, files, apex)
            for key in wanted - own:
                claimed[key] = -1 if claimed.get(key, number) != number else number
            groups.append(Group(sorted(wanted), members[0]))
        for group in groups:  # a connecting file two programs want is read by neither (it names no apex)
            group.keys = [key for key in group.keys if key in apex or claimed.get(key) != -1]
        for key in sorted(apex):
            if not any(key in group.keys for group in groups):
                calls = [(home, line) for number in owners.get(key, ()) for home in programs[number][0]
                         for line in self.facts[home].initialize_lines]
                groups.append(Group([key], None, calls))
        return groups

    def _connecting(self, own: Set[Key], files: Set[Key], apex: Set[Key]) -> Set[Key]:
        """Files naming no apex an import away from `own` (importers anywhere), and the program's files between
        two of `own`."""
        near = {other for key in own for other in self.edges[key] | self.back[key]}
        between = self._reach(own, self.edges, files) & self._reach(own, self.back, files)
        return (near | between) - apex


def _union(pairs: List[List[Key]], items: List[Key]) -> List[List[Key]]:
    """The classes of `items` that `pairs` join, each in the order of `items`."""
    parent = {item: item for item in items}

    def root(item: Key) -> Key:
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    for a, b in pairs:
        parent[root(a)] = root(b)
    classes: Dict[Key, List[Key]] = {}
    for item in items:
        classes.setdefault(root(item), []).append(item)
    return list(classes.values())
