"""What a script does with apex, read from libcst's metadata: every use of an apex name, resolved through
imports and scopes to the API it is (apexlite.migrate.apis), plus the tree questions the planners ask
(which statement holds a node, which block holds a statement, whether two names are one binding).

Cost is linear in the script's length and paid once: one traversal indexes the tree (parents, source
order, each subtree's extent, so every later walk is a slice), scopes and expression contexts come from
libcst, qualified names are asked of the scopes only for names an apex import binds, and line numbers are
computed only when a line is first asked for (apexlite.migrate.lines, one plain code generation).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple, Union

import libcst as cst
from libcst.metadata import (
    ExpressionContext, ExpressionContextProvider, MetadataWrapper, QualifiedName,
    QualifiedNameSource, ScopeProvider,
)

from apexlite.migrate import apis
from apexlite.migrate.dotted import base_name, dotted_text
from apexlite.migrate.import_reach import reached_by_apex_import
from apexlite.migrate.lines import LineIndex

Block = Union[cst.Module, cst.IndentedBlock]
DottedNode = Union[cst.Name, cst.Attribute]


@dataclass
class ApexUse:
    """One place a script names an apex API: the outermost Name/Attribute chain that resolves to it."""

    node: DottedNode
    api: str  # canonical (apis.canonical)
    written: str  # the dotted name it resolves to before canonicalisation (`apex.amp.scale_loss`)
    bound: str  # what its first name is bound to (`apex.amp` for `amp.scale_loss` after `from apex import amp`)
    star: bool = False  # its first name came from `from apex... import *`
    analysis: Any = field(default=None, repr=False, compare=False)  # a weak reference: a use kept in a result
    #                                                                 must not keep the whole analysis alive

    @property
    def line(self) -> int:
        return self.analysis().line(self.node)


class TreeIndex(cst.CSTVisitor):
    """One traversal of a module: every node's parent, the nodes in source order, and where each node's
    subtree ends in that order (so the nodes inside any node are a slice)."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__()
        self.parent: Dict[cst.CSTNode, cst.CSTNode] = {}
        self.order: List[cst.CSTNode] = []
        self.start: Dict[cst.CSTNode, int] = {}
        self.end: Dict[cst.CSTNode, int] = {}
        self._stack: List[cst.CSTNode] = []
        module.visit(self)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._stack:
            self.parent[node] = self._stack[-1]
        self.start[node] = len(self.order)
        self.order.append(node)
        self._stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()
        self.end[original_node] = len(self.order)

    def inside(self, node: cst.CSTNode) -> Optional[List[cst.CSTNode]]:
        """`node` and every node inside it, in source order (None for a node of another tree)."""
        start = self.start.get(node)
        return None if start is None else self.order[start:self.end[node]]


class Analysis(cst.MetadataDependent):
    """Metadata of one parsed script and the apex uses in it."""

    METADATA_DEPENDENCIES = (ScopeProvider, ExpressionContextProvider)

    def __init__(self, wrapper: MetadataWrapper) -> None:
        super().__init__()
        self.wrapper = wrapper
        self.module = wrapper.module
        self.metadata = wrapper.resolve_many(self.METADATA_DEPENDENCIES)
        self.index = TreeIndex(self.module)
        self._lines: Optional[LineIndex] = None
        self.identifiers: Set[str] = {node.value for node in self.nodes(cst.Name)}
        self.uses: List[ApexUse] = self._collect_uses()

    # --- generic questions --------------------------------------------------------------------------
    def nodes(self, kind) -> Iterator[cst.CSTNode]:
        """Every node of the given kinds in the module, in source order."""
        return (node for node in self.index.order[1:] if isinstance(node, kind))

    def walk(self, node: cst.CSTNode, kinds) -> Iterator[cst.CSTNode]:
        """Every node of the given kinds inside `node` (itself included), in source order."""
        inside = self.index.inside(node)
        if inside is None:
            return _walk(node, kinds)
        return (found for found in inside if isinstance(found, kinds))

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.index.parent.get(node)

    def line(self, node: cst.CSTNode) -> int:
        if self._lines is None:  # computed for the whole module the first time a line is asked for
            self._lines = LineIndex(self.module)
        return self._lines.line(node)

    def position(self, node: cst.CSTNode) -> int:
        """Where `node` is in source order (for comparing two nodes of this module)."""
        return self.index.start[node]

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def is_load(self, node: cst.Name) -> bool:
        return self.get_metadata(ExpressionContextProvider, node, None) is ExpressionContext.LOAD

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def parameter_owner(self, name: cst.Name) -> Optional[cst.CSTNode]:
        """The function whose parameter `name` is, when that parameter is the name's only binding; else None."""
        scope = self.scope(name)
        bindings = list(scope[name.value]) if scope is not None else []
        if len(bindings) != 1 or not isinstance(getattr(bindings[0], "node", None), cst.Param):
            return None
        return self.enclosing_scope_owner(bindings[0].node)

    def within(self, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
        """Whether `node` lies inside `outer` (a function, a loop, a block)."""
        return any(ancestor is outer for ancestor in self.ancestors(node))

    def statement_of(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The statement, directly in a block (module or indented block), that holds `node`."""
        current = node
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.Module, cst.IndentedBlock)) and isinstance(current, cst.BaseStatement):
                return current
            current = parent
        raise ValueError("node is not inside a statement")

    def small_statement_of(self, node: cst.CSTNode) -> Optional[cst.BaseSmallStatement]:
        """The small statement (`x = ...`, `f()`) holding `node`, if it is in one."""
        current: cst.CSTNode = node
        for parent in self.ancestors(node):
            if isinstance(current, cst.BaseSmallStatement):
                return current
            if isinstance(parent, (cst.BaseCompoundStatement, cst.IndentedBlock, cst.Module)):
                return None
            current = parent
        return None

    def block_of(self, statement: cst.BaseStatement) -> Block:
        block = self.parent(statement)
        assert isinstance(block, (cst.Module, cst.IndentedBlock))
        return block

    def enclosing_scope_owner(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The function or class whose body holds `node`; None at module level."""
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return parent
        return None

    def scope(self, node: cst.CSTNode):
        return self.get_metadata(ScopeProvider, node, None)

    def binding_scopes(self, name: cst.Name) -> Set[int]:
        """The scopes (by identity) in which the bindings `name` sees live."""
        scope = self.scope(name)
        if scope is None:
            return set()
        return {id(assignment.scope) for assignment in scope[name.value]}

    def same_binding(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """Whether two Name/Attribute chains with the same text see the same variable."""
        if self.code(first) != self.code(second):
            return False
        base_a, base_b = base_name(first), base_name(second)
        if base_a is None or base_b is None:
            return False
        scopes_a, scopes_b = self.binding_scopes(base_a), self.binding_scopes(base_b)
        return bool(scopes_a) and scopes_a == scopes_b

    def fresh_name(self, wanted: str, taken: Set[str]) -> str:
        """`wanted`, or `wanted_2`, ... : a name the script does not use and migrate has not handed out."""
        candidate, number = wanted, 1
        while candidate in self.identifiers or candidate in taken:
            number += 1
            candidate = f"{wanted}_{number}"
        taken.add(candidate)
        return candidate

    def loaded_names(self, node: cst.CSTNode) -> Set[str]:
        """Names read anywhere inside `node`."""
        return {name.value for name in self.walk(node, cst.Name) if self.is_load(name)}

    def assigned_names(self, node: cst.CSTNode) -> Set[str]:
        """Names bound anywhere inside `node` (nested functions and classes included by their own name)."""
        names: Set[str] = set()
        for name in self.walk(node, cst.Name):
            context = self.get_metadata(ExpressionContextProvider, name, None)
            if context is ExpressionContext.STORE:
                names.add(name.value)
        return names

    def dotted_uses(self, node: cst.CSTNode) -> Set[str]:
        """The text of every Name/Attribute chain read inside `node` (`model`, `self.model`, ...)."""
        found: Set[str] = set()
        for part in self.walk(node, (cst.Name, cst.Attribute)):
            text = dotted_text(part)
            if text is not None:
                found.add(text)
        return found

    # --- apex uses -----------------------------------------------------------------------------------
    def _collect_uses(self) -> List[ApexUse]:
        uses: List[ApexUse] = []
        star = self._star_imported()
        candidates = self._apex_bound_names() | set(star)
        for name in self.nodes(cst.Name):
            if name.value not in candidates or self._in_import(name) or self._is_attribute_name(name):
                continue
            qualified = self.qualified_names(name)
            written = self._apex_name(name, qualified, star)
            if written is None:
                continue
            bound, from_star = written, not qualified
            node: DottedNode = name
            parent = self.parent(node)
            while isinstance(parent, cst.Attribute) and parent.value is node:
                written += "." + parent.attr.value
                node, parent = parent, self.parent(parent)
            uses.append(ApexUse(node, apis.canonical(written), written, bound, from_star, weakref.ref(self)))
        uses.sort(key=lambda use: self.index.start[use.node])  # source order
        return uses

    def _apex_bound_names(self) -> Set[str]:
        """Every name an apex import binds: the first name of any apex use is one of them."""
        names: Set[str] = set()
        for node in self.nodes((cst.Import, cst.ImportFrom)):
            if isinstance(node, cst.ImportFrom):
                module = dotted_text(node.module) if node.module is not None and not node.relative else None
                if module and apis.is_apex_name(module) and not isinstance(node.names, cst.ImportStar):
                    names.update(dotted_text(alias.asname.name if alias.asname else alias.name) or ""
                                 for alias in node.names)
                continue
            for alias in node.names:
                imported = dotted_text(alias.name) or ""
                if apis.is_apex_name(imported):
                    names.add(dotted_text(alias.asname.name) if alias.asname else imported.split(".")[0])
        return names

    def qualified_names(self, node: cst.CSTNode) -> Set[QualifiedName]:
        """What libcst's QualifiedNameProvider gives for `node` (a name or attribute), asked of its scope for
        this one node instead of a pass over the whole module."""
        scope = self.scope(node)
        return set(scope.get_qualified_names_for(node)) if scope is not None else set()

    def _apex_name(self, name: cst.Name, qualified: Set[QualifiedName], star: Dict[str, str]) -> Optional[str]:
        imported = [q.name for q in qualified if q.source is QualifiedNameSource.IMPORT and apis.is_apex_name(q.name)]
        if imported and len(imported) < len(qualified) and not reached_by_apex_import(self, name):
            return None  # `else: from torch.nn.parallel import DistributedDataParallel` binds it here
        if imported:
            return sorted(imported)[0]
        if name.value in star and self.is_load(name):
            scope = self.scope(name)
            if scope is not None and not scope[name.value]:
                return f"{star[name.value]}.{name.value}"
        return None

    def _star_imported(self) -> Dict[str, str]:
        """name -> apex module, for names bound by `from apex... import *`."""
        names: Dict[str, str] = {}
        for node in self.nodes(cst.ImportFrom):
            if isinstance(node.names, cst.ImportStar) and node.module is not None and not node.relative:
                module = dotted_text(node.module)
                if module and apis.is_apex_name(module):
                    names.update({star_name: module for star_name in apis.star_names(module)})
        return names

    def _in_import(self, node: cst.CSTNode) -> bool:
        return any(isinstance(parent, (cst.Import, cst.ImportFrom)) for parent in self.ancestors(node))

    def _is_attribute_name(self, node: cst.Name) -> bool:
        parent = self.parent(node)
        return isinstance(parent, cst.Attribute) and parent.attr is node

    def uses_of(self, api: str) -> List[ApexUse]:
        return [use for use in self.uses if use.api == api]

    def call_of(self, use: ApexUse) -> Optional[cst.Call]:
        """The call whose function is `use`, if `use` is called."""
        parent = self.parent(use.node)
        return parent if isinstance(parent, cst.Call) and parent.func is use.node else None


def _walk(node: cst.CSTNode, kinds) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, kinds):
            yield current
        stack.extend(reversed(current.children))


def parse(source: bytes) -> Tuple[MetadataWrapper, Analysis]:
    """Parse `source` (raises libcst.ParserSyntaxError) and analyse it."""
    wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)  # a fresh tree: no copy needed
    return wrapper, Analysis(wrapper)
