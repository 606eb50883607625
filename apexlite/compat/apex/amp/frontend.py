"""`apex.amp.frontend`: initialize, the amp state dict and the opt-level objects.

O0-O3 are classes as in apex: each has `brief` and `more`, and an instance called on a Properties sets
that level's defaults on it (`opt_levels["O2"](properties)`); `opt_levels` maps names to instances.
"""
from __future__ import annotations

import torch

from apexlite.amp.frontend import initialize, load_state_dict, state_dict  # noqa: F401
from apexlite.amp.opt_levels import OPT_LEVELS, Properties, defaults_for
from apexlite.compat import generic


class _OptLevel:
    """An optimization level: calling it sets its defaults (fp16 as the low dtype) on a Properties."""

    name = ""
    brief = ""
    more = ""

    def __call__(self, properties: Properties) -> Properties:
        for option, value in defaults_for(self.name, torch.float16).items():
            setattr(properties, option, value)
        return properties


def _level_class(name: str) -> type:
    defaults = defaults_for(name, torch.float16)
    more = "Defaults: " + ", ".join(f"{option}={value}" for option, value in defaults.items()) + ".\n"
    return type(name, (_OptLevel,), {"name": name, "brief": OPT_LEVELS[name].brief, "more": more,
                                     "__doc__": OPT_LEVELS[name].brief.strip(), "__module__": __name__})


O0, O1, O2, O3 = (_level_class(name) for name in ("O0", "O1", "O2", "O3"))
opt_levels = {"O3": O3(), "O2": O2(), "O1": O1(), "O0": O0()}

__all__ = ["initialize", "state_dict", "load_state_dict", "Properties", "opt_levels", "O0", "O1", "O2", "O3"]
__getattr__ = generic.fallback_getattr(__name__)
