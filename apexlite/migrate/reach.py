"""Where amp.initialize's optimizers and models are, in one file or several, and where the GradScaler
that replaces amp can be read.

An optimizer is reached (1) by the names amp.initialize assigned, in their own scope; (2) through a
parameter of a function every one of whose calls passes it there from a place the GradScaler reaches
(apex's imagenet `train(train_loader, model, criterion, optimizer, epoch)`): the function then gets the
GradScaler as a new keyword-only parameter, `scaler`, and each call passes it (a call migrate does not
see fails loudly, missing the argument, instead of training wrongly); (3) in another file, by importing
it from the module that made it (`from train import optimizer`): the GradScaler is imported beside it.
Functions are followed within the files migrated together; calls in other files are not seen.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from apexlite.migrate.analysis import Analysis, dotted_text
from apexlite.migrate.class_ties import HomeClass
from apexlite.migrate.edits import Plan
from apexlite.migrate.guards import resolves_alike
from apexlite.migrate.import_ties import ImportIndex, ImportTie, Key, Resolver, import_index, import_tie


@dataclass
class Thread:
    """A function that receives amp's optimizers (parameter name -> optimizer index) and gets the GradScaler."""

    key: Key
    function: cst.FunctionDef
    optimizers: Dict[str, int]
    models: Set[str] = field(default_factory=set)  # parameters that receive amp's models
    calls: List[Tuple[Key, cst.Call]] = field(default_factory=list)


class Ties:
    """One file's view: which expressions are amp's optimizers, and where the GradScaler can be read."""

    def __init__(self, analysis: Analysis, home_owner: Optional[cst.CSTNode], targets: Sequence[cst.CSTNode],
                 threads: Dict[int, Thread], imported: Optional[ImportTie],
                 home_class: Optional[HomeClass] = None) -> None:
        self.analysis = analysis
        self.home_class = home_class  # amp.initialize on `self.` attributes: the class's methods reach them
        self.home_owner = home_owner  # the scope amp.initialize runs in, when it is in this file
        self.targets = list(targets)
        self.threads = threads  # id(function) -> Thread, for functions of this file
        self.imported = imported

    def optimizer(self, node: cst.CSTNode) -> Optional[int]:
        """The index of the amp optimizer `node` is, if it certainly is one."""
        index = self.home_class.optimizer(self.analysis, node) if self.home_class is not None else None
        if index is not None:
            return index
        for index, target in enumerate(self.targets):
            if self.analysis.same_binding(node, target):
                return index
        if not isinstance(node, cst.Name):
            return None
        binding = _only_binding(self.analysis, node)
        if isinstance(binding, cst.Param):
            function = self.analysis.enclosing_scope_owner(binding)
            thread = self.threads.get(id(function))
            return thread.optimizers.get(node.value) if thread is not None else None
        if self.imported is not None and binding is self.imported.statement:
            return self.imported.optimizers.get(node.value)
        return None

    def calls_of(self, function: Optional[cst.CSTNode]) -> Optional[List[Tuple[Key, cst.Call]]]:
        """Where a function of this file that receives amp's optimizer is called, as (file key, call) in every
        file migrate reads; None for any other function (a helper is judged where it is called)."""
        thread = self.threads.get(id(function)) if function is not None else None
        return None if thread is None else list(thread.calls)

    def reads_alike(self, target: cst.CSTNode, place: cst.CSTNode) -> bool:
        """Whether amp.initialize's `target` (`optimizer`, `self.optimizer`), written at `place`, is the same object
        there: the same bindings, or an attribute of `self` in a method of amp.initialize's class."""
        home_class = self.home_class
        if home_class is not None and isinstance(target, cst.Attribute) \
                and dotted_text(target.value) == home_class.self_name \
                and home_class.method_of(self.analysis, place) is not None:
            return True
        return resolves_alike(self.analysis, [target], place)

    def model_names(self) -> Set[str]:
        return {name for thread in self.threads.values() for name in thread.models}

    def in_home_scope(self, node: cst.CSTNode) -> bool:
        """Whether `node` sees amp.initialize's own scope (its names, the flags of its `if`)."""
        if self.home_owner is None:
            return False
        if isinstance(self.home_owner, cst.Module):
            return True
        return any(ancestor is self.home_owner for ancestor in self.analysis.ancestors(node))

    def reaches_scaler(self, node: cst.CSTNode) -> bool:
        """Whether a GradScaler made beside amp.initialize can be read at `node` under its own name."""
        if self.in_home_scope(node) or self.imported is not None:
            return True
        if self.home_class is not None and self.home_class.method_of(self.analysis, node) is not None:
            return True
        return any(id(ancestor) in self.threads for ancestor in self.analysis.ancestors(node))


@dataclass
class Unit:
    """One file of a migration: its plan (and analysis), where it is, and its view of amp's objects."""

    key: Key
    plan: Plan
    ties: Ties
    home: bool  # amp.initialize is in this file

    @property
    def analysis(self) -> Analysis:
        return self.plan.analysis


def _only_binding(analysis: Analysis, name: cst.Name) -> Optional[cst.CSTNode]:
    scope = analysis.scope(name)
    assignments = list(scope[name.value]) if scope is not None else []
    return getattr(assignments[0], "node", None) if len(assignments) == 1 else None


# --- linking -------------------------------------------------------------------------------------------
def _parameters(function: cst.FunctionDef) -> Tuple[List[str], List[str], bool]:
    """(positional parameter names, keyword-only names, whether it takes *args/**kwargs)."""
    params = function.params
    positional = [param.name.value for param in [*params.posonly_params, *params.params]]
    keyword_only = [param.name.value for param in params.kwonly_params]
    star = isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None
    return positional, keyword_only, star


def _bind(call: cst.Call, positional: List[str], keyword_only: List[str]) -> Optional[Dict[str, cst.BaseExpression]]:
    bound: Dict[str, cst.BaseExpression] = {}
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is None:
            if index >= len(positional):
                return None
            bound[positional[index]] = arg.value
        elif arg.keyword.value in positional or arg.keyword.value in keyword_only:
            bound[arg.keyword.value] = arg.value
        else:
            return None
    return bound


def argument_for(function: cst.FunctionDef, call: cst.Call, name: str) -> Optional[cst.BaseExpression]:
    """The expression `call` passes to `function`'s parameter `name`; None when it passes none or cannot be told."""
    positional, keyword_only, _ = _parameters(function)
    bound = _bind(call, positional, keyword_only)
    return bound.get(name) if bound is not None else None


def _references(analyses: Dict[Key, Analysis], key: Key, function: cst.FunctionDef,
                imports: ImportIndex) -> Optional[List[Tuple[Key, cst.Call]]]:
    """Every call of a module-level function in the files; None when it is used any other way (passed
    on, rebound, reached through a module object)."""
    analysis = analyses[key]
    scope = analysis.scope(function)
    own = [a for a in scope.assignments[function.name.value]] if scope is not None else []
    if len(own) != 1 or getattr(own[0], "node", None) is not function:
        return None
    accesses = [(key, access.node) for access in own[0].references]
    for other_key, node, bound in imports.get((key, function.name.value), ()):
        module_scope = analyses[other_key].scope(node)
        for assignment in (module_scope.assignments[bound] if module_scope is not None else ()):
            if getattr(assignment, "node", None) is node:
                accesses.extend((other_key, access.node) for access in assignment.references)
    calls = []
    for access_key, name in accesses:
        parent = analyses[access_key].parent(name)
        if not (isinstance(parent, cst.Call) and parent.func is name):
            return None
        calls.append((access_key, parent))
    return calls


def link(analyses: Dict[Key, Analysis], home: Key, call: cst.Call, optimizer_targets: Sequence[cst.CSTNode],
         model_targets: Sequence[cst.CSTNode], resolve: Resolver,
         home_class: Optional[HomeClass] = None) -> Dict[Key, Ties]:
    """Each file's Ties for the amp.initialize `call` in `home` (threads found to a fixpoint)."""
    home_analysis = analyses[home]
    home_owner = home_analysis.enclosing_scope_owner(call) or home_analysis.module
    index = import_index(analyses, resolve)
    imports = {key: import_tie(analyses[key], key, home, home_owner, optimizer_targets, index)
               for key in analyses if key != home}
    threads: Dict[int, Thread] = {}

    def ties_of(key: Key) -> Ties:
        own = {id(t.function): t for t in threads.values() if t.key == key}
        if key == home:
            return Ties(home_analysis, home_owner, optimizer_targets, own, None, home_class)
        return Ties(analyses[key], None, [], own, imports[key])

    candidates = []
    for key, analysis in analyses.items():
        for statement in analysis.module.body:
            if isinstance(statement, cst.FunctionDef) and statement is not home_owner:
                calls = _references(analyses, key, statement, index)
                if calls:
                    candidates.append((key, statement, calls))
    changed = True
    while changed:
        changed = False
        for key, function, calls in candidates:
            if id(function) in threads:
                continue
            thread = _thread(analyses, key, function, calls, ties_of, model_targets, home)
            if thread is not None:
                threads[id(function)] = thread
                changed = True
    return {key: ties_of(key) for key in analyses}


def _thread(analyses, key: Key, function: cst.FunctionDef, calls: List[Tuple[Key, cst.Call]], ties_of,
            model_targets, home: Key) -> Optional[Thread]:
    positional, keyword_only, _ = _parameters(function)
    optimizers: Dict[str, Optional[int]] = {}
    models: Dict[str, bool] = {}
    for call_key, call in calls:
        bound = _bind(call, positional, keyword_only)
        ties = ties_of(call_key)
        if bound is None or not ties.reaches_scaler(call):
            return None
        for name in positional + keyword_only:
            value = bound.get(name)
            index = ties.optimizer(value) if value is not None else None
            optimizers[name] = index if optimizers.get(name, index) == index else None
            is_model = value is not None and call_key == home and any(
                analyses[home].same_binding(value, target) for target in model_targets)
            is_model = is_model or (value is not None and dotted_text(value) in ties.model_names())
            models[name] = models.get(name, True) and is_model
    tied = {name: index for name, index in optimizers.items() if index is not None}
    if not tied:
        return None
    return Thread(key, function, tied, {name for name, yes in models.items() if yes}, calls)
