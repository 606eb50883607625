"""O1's machinery: the op tables and cast policies, the casting wrappers (Python and native), the patcher
that installs them, the cast cache and the per-thread cast switches."""
