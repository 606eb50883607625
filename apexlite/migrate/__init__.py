"""`python -m apexlite migrate`: rewrite a legacy apex.amp script into native torch.amp, and prove it.

The rewrite runs on libcst's concrete syntax tree, so everything it does not change keeps its exact
bytes. libcst is the optional extra `apexlite[migrate]`; only this package imports it, and only when
`migrate` runs (apexlite.migrate.cli checks for it first), so `run`, `check` and the import hook never
need it. Modules: programs (the files of a folder grouped by what imports what), analysis (which apex
API each name is, through apex's module tree, the table `check` reads; lines: line numbers), one planner
per concern (initialize, scale_loss, regions, clipping, state_dicts, replacements; proof: amp.initialize
goes only where what replaces it was found), edits (the plan) and applier (applies it; kept_comments:
the comments of replaced code), imports (the final import pass, from usage: what the result reads),
soundness (with local_names: no name left undefined on a path where the original defined it), engine (the
whole pipeline); around it, files (the scripts and notebooks of one run, read through
apexlite.script_program), writing (atomic, through symlinks, onto regular files only), report and summary
(one file, or a table for many), cli, and verify (with scaling, which tells a loss-scaling difference from
an arithmetic one, and verify_child, the migrated script's process).
"""
