"""`python -m apexlite migrate`: rewrite a legacy apex.amp script into native torch.amp, and prove it.

The rewrite runs on libcst's concrete syntax tree, so everything it does not change keeps its exact
bytes. libcst is the optional extra `apexlite[migrate]`; only this package imports it, and only when
`migrate` runs (apexlite.migrate.cli checks for it first), so `run`, `check` and the import hook never
need it. Modules: analysis (which apex API each name is, through apex's module tree, the table `check`
reads), one planner per concern (initialize, scale_loss, regions, clipping, state_dicts, replacements),
edits (the plan) and applier (applies it), imports (the final import pass), soundness (with local_names:
no name left undefined on a path where the original defined it), engine (the whole pipeline); around it, files
(the scripts and notebooks of one run, read through apexlite.script_program), writing (atomic, through
symlinks), report and summary (one file, or a table for many), cli, and verify (with scaling, which tells
a loss-scaling difference from an arithmetic one, and verify_child, the migrated script's process).
"""
