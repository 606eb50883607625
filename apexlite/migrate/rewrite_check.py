"""Whether a rewrite may be used: it compiles (where the original did), reads no name it binds nowhere, and
leaves no name undefined on a path where the original defined it (the flow check: apexlite.migrate.soundness).
"""
from __future__ import annotations

import builtins
import importlib.util
import symtable
from dataclasses import dataclass
from typing import List, Optional, Set, Tuple

from apexlite.migrate.soundness import undefined_reads
from apexlite.migrate.usage import symbols_of

_BUILTINS = frozenset(dir(builtins))


def _compiles(source: bytes) -> Optional[str]:
    try:
        compile(source, "<migrated>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def symbols(source: bytes) -> Tuple[Set[str], Set[str]]:
    """(names read and bound nowhere, builtins aside; names imported at module level), from Python's symbol
    tables: order does not matter to them (the flow check, soundness.undefined_reads, sees order)."""
    top = symtable.symtable(importlib.util.decode_source(source), "<migrate>", "exec")
    tables, bound, read = [top], set(), set()
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for symbol in symbols_of(table):
            name = symbol.get_name()
            if table is top or symbol.is_declared_global():
                if symbol.is_assigned() or symbol.is_imported():
                    bound.add(name)
                if symbol.is_referenced():
                    read.add(name)
            elif symbol.is_global() and symbol.is_referenced():  # read in a function or class, bound nowhere in it
                read.add(name)
    imported = {symbol.get_name() for symbol in symbols_of(top) if symbol.is_imported()}
    return read - bound - _BUILTINS, imported


@dataclass
class Applied:
    """One file's rewrite: the first pass's output (without the import edits) and the end result."""

    first: bytes
    migrated: bytes


def _lost_names(source: bytes, unsure: Set[str], applied: Applied) -> Set[str]:
    """Names the migrated script reads and binds nowhere where the original bound them before every read
    (`unsure`: names some path of the original reads undefined), the rewrite (source -> first) and the
    import pass (first -> migrated) apart, so the `import torch` that pass adds cannot hide a name the
    rewrite lost."""
    (unbound_first, imported_first), (unbound_migrated, imported_migrated) = (symbols(applied.first),
                                                                              symbols(applied.migrated))
    added = imported_migrated - imported_first  # `import torch`, added by the import pass before any use
    return (unbound_first - symbols(source)[0] - unsure - added) | (unbound_migrated - unbound_first)


def soundness_error(source: bytes, applied: Applied) -> Tuple[Optional[str], List[str]]:
    """(why the rewrite must not be used, names some path would read undefined that the original defined)."""
    migrated = applied.migrated
    if migrated == source:
        return None, []
    error = _compiles(migrated)
    if error is not None and _compiles(source) is not None:  # the original did not compile either
        error = None
    if error is not None:
        return error, []
    before = undefined_reads(source)
    lost = _lost_names(source, {name for _, name in before}, applied)
    # a lost name bound somewhere is only read before its binding: the flow check below reports it
    never_bound = lost & symbols(migrated)[0] if lost else set()
    if never_bound:
        return (f"it would read {', '.join(sorted(never_bound))} without defining it (a migrate bug: please "
                "report it)"), []
    partial = sorted({name for (scope, name) in undefined_reads(migrated) if (scope, name) not in before})
    if partial:
        return f"it would read {', '.join(partial)} where some path leaves it undefined", partial
    return None, []
