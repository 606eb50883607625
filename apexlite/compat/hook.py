"""The import hook behind `apexlite run`: `import apex...`, `import amp_C` and apex's other top-level
modules resolve to apexlite.compat.

The hook is a `sys.meta_path` finder installed only by the runner, in the process that runs the
script; processes that script starts get it through `child_path` (see there). Nothing in apexlite
installs it at import time, so a real NVIDIA apex installed next to apexlite is never shadowed
outside `apexlite run`. Aliased modules are the compat modules themselves
(`sys.modules["apex.amp"] is apexlite.compat.apex.amp`), so isinstance checks and module-level state
are shared whichever name a script uses. What an apex path resolves to follows apex's tree
(`apexlite.compat.generic`): apexlite's module when it has one, a placeholder module for what
python-only apex imported and apexlite does not implement, an ImportError naming the alternative for
what python-only apex refused, and the normal ModuleNotFoundError for paths apex never had. apex's
compiled extensions (top-level modules such as `fused_layer_norm_cuda`, `syncbn`) that apexlite implements
resolve to apexlite.compat.<name>; importing one it does not implement raises the ModuleNotFoundError of
an apex built without it, naming the alternative, unless something else on the path provides it. The
table behind these answers is read only when a script imports a path apexlite has no file for. While
installed, the finder also answers
`importlib.metadata` for the `apex` distribution, so libraries that check for apex by its metadata
(Hugging Face transformers' `is_apex_available()`) find it.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
from typing import Dict, Iterator, List, Optional

from apexlite.compat import apex_tree, generic
from apexlite.compat.child_path.sitecustomize import LEGACY_TOP_LEVEL, REFUSED_EXTENSIONS, apex_distributions

COMPAT_PACKAGE = "apexlite.compat"
# legacy top-level name -> module that provides it
TOP_LEVEL = {name: f"{COMPAT_PACKAGE}.{name}" for name in LEGACY_TOP_LEVEL}
_REFUSED = frozenset(REFUSED_EXTENSIONS)


def target_name(name: str) -> Optional[str]:
    """The apexlite module behind legacy module `name`, or None when `name` is not a legacy name."""
    top, _, rest = name.partition(".")
    if top not in TOP_LEVEL:
        return None
    return TOP_LEVEL[top] + ("." + rest if rest else "")


def legacy_name(module_name: str) -> Optional[str]:
    """The legacy name under which compat module `module_name` is published (inverse of target_name)."""
    for legacy, target in TOP_LEVEL.items():
        if module_name == target or module_name.startswith(target + "."):
            return legacy + module_name[len(target):]
    return None


class _AliasLoader(importlib.abc.Loader):
    """Hands an already-imported module to the import system under a second name."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.original_spec = getattr(module, "__spec__", None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system stamps the alias spec onto the module; keep the module's own identity.
        if self.original_spec is not None:
            module.__spec__ = self.original_spec

    def get_code(self, fullname: str) -> Optional[types.CodeType]:
        """The apexlite module's code, for `python -m apex.x` (runpy runs a module from its loader's code)."""
        loader = getattr(self.original_spec, "loader", None)
        if loader is None or not hasattr(loader, "get_code"):
            raise ImportError(f"{fullname} is apexlite's {getattr(self.module, '__name__', '?')}, which cannot be "
                              "run as a script")
        return loader.get_code(self.original_spec.name)


class _RefusingLoader(importlib.abc.Loader):
    """Loads nothing: executing the module raises the ImportError apexlite gives for a refused apex module."""

    def __init__(self, legacy_name: str) -> None:
        self.legacy_name = legacy_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        raise generic.refusal(self.legacy_name)


class ApexAliasFinder(importlib.abc.MetaPathFinder):
    """Resolves `apex`, `apex.*`, `amp_C` and apex's other top-level modules to apexlite.compat; records the
    aliases it creates."""

    def __init__(self) -> None:
        self.aliases: List[str] = []

    def _publish_loaded(self, requested: str) -> None:
        """Alias every compat module already imported, so later imports hit sys.modules directly.

        Doing this eagerly keeps package attributes intact: `apex.amp._amp_state` stays the state
        object even after `import apex.amp._amp_state` (only a fresh load rebinds the attribute).
        The name being imported is left to the import system: finding it in sys.modules already,
        importlib would take the module's own spec and execute its file a second time.
        """
        for module_name, module in list(sys.modules.items()):
            alias = legacy_name(module_name)
            if alias is not None and alias != requested and alias not in sys.modules:
                sys.modules[alias] = module
                self.aliases.append(alias)

    def publish_alias(self, alias: str, module: types.ModuleType) -> None:
        """`alias` names `module` in sys.modules until the hook is removed (a submodule reached as an attribute)."""
        if alias not in sys.modules:
            sys.modules[alias] = module
            self.aliases.append(alias)

    def find_spec(self, name: str, path=None, target=None) -> Optional[importlib.machinery.ModuleSpec]:
        if name in _REFUSED:
            return self._refused_extension(name, path, target)
        if target_name(name) is None:
            return None
        try:
            module = generic.load(name)
        except generic.RefusedImport:
            row = apex_tree.tree().row(name)
            if row is None or apex_tree.tree().status(name)[0] != apex_tree.REFUSED:
                raise  # a module apexlite has imports a refused one: that error is the user's answer
            # found, as python-only apex found the file, but its import fails (in exec_module)
            return importlib.machinery.ModuleSpec(name, _RefusingLoader(name), is_package=row.kind == "package")
        except ModuleNotFoundError as error:
            if error.name == name:
                return None  # apex never had it either: a normal ImportError follows
            raise  # a module apexlite has failed inside: that error is the user's answer
        self._publish_loaded(name)
        self.aliases.append(name)
        return importlib.machinery.ModuleSpec(name, _AliasLoader(module), is_package=hasattr(module, "__path__"))

    def _refused_extension(self, name: str, path, target) -> Optional[importlib.machinery.ModuleSpec]:
        """A refusing spec for an apex extension apexlite does not implement, unless another finder has it."""
        for finder in sys.meta_path:
            if finder is self or is_apexlite_finder(finder) or not hasattr(finder, "find_spec"):
                continue
            if finder.find_spec(name, path, target) is not None:
                return None  # a real build of it is installed: leave it to the import system
        return importlib.machinery.ModuleSpec(name, _RefusingLoader(name))

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        """`importlib.metadata`'s question: the `apex` distribution (version 0.1+apexlite) while installed."""
        return apex_distributions(context)


def install() -> ApexAliasFinder:
    """Put the finder first on sys.meta_path (ahead of any installed apex) and return it."""
    finder = ApexAliasFinder()
    sys.meta_path.insert(0, finder)
    return finder


def ensure_installed() -> ApexAliasFinder:
    """This process's finder, installing one first if there is none (a child of a run)."""
    for finder in sys.meta_path:
        if isinstance(finder, ApexAliasFinder):
            return finder
    return install()


def replace_stand_in(name: str) -> None:
    """Run by a stand-in module of `child_path` as it is imported: let the hook provide `name`.

    The stand-in leaves `sys.modules` and `name` is imported again, now through the hook; the import
    system hands the importer whatever `sys.modules[name]` holds when the stand-in finishes.
    """
    if name not in TOP_LEVEL:
        raise ImportError(f"{name} is a stand-in for a legacy top-level module; import one of "
                          f"{', '.join(TOP_LEVEL)} instead (under `python -m apexlite run`).")
    ensure_installed()
    del sys.modules[name]
    importlib.import_module(name)


def is_apexlite_finder(finder: object) -> bool:
    """Whether `finder` is one of apexlite's (this hook, or a child's start-up finder before hand-over)."""
    return isinstance(finder, ApexAliasFinder) or type(finder).__name__ == "DeferredApexFinder"


def uninstall(finder: ApexAliasFinder) -> None:
    """Remove the finder and every alias it published."""
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    for alias in finder.aliases:
        sys.modules.pop(alias, None)
    finder.aliases.clear()


@contextlib.contextmanager
def apex_aliases() -> Iterator[ApexAliasFinder]:
    """The hook for the duration of a block (tests, embedding); the runner installs it for good."""
    finder = install()
    saved: Dict[str, types.ModuleType] = {k: v for k, v in sys.modules.items() if target_name(k) is not None}
    for key in saved:
        del sys.modules[key]
    try:
        yield finder
    finally:
        uninstall(finder)
        sys.modules.update(saved)
