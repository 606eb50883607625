"""`apex.amp.frontend`: initialize, the amp state dict and the opt-level objects."""
from apexlite.amp.frontend import initialize, load_state_dict, state_dict  # noqa: F401
from apexlite.amp.opt_levels import OPT_LEVELS, Properties  # noqa: F401

# apex exposed each level as an object with a `brief` description; OptLevel has the same field.
opt_levels = dict(OPT_LEVELS)
O0, O1, O2, O3 = (opt_levels[name] for name in ("O0", "O1", "O2", "O3"))
