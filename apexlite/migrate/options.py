"""The choices a user gives `migrate` for what the script leaves to run time or to taste."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

O2_APEXLITE = "apexlite"
O2_BF16_AUTOCAST = "bf16-autocast"
O2_CHOICES = (O2_APEXLITE, O2_BF16_AUTOCAST)


@dataclass(frozen=True)
class MigrateOptions:
    """opt_level / loss_scale: used where the script picks them at run time (`opt_level=args.opt_level`);
    o2: O2 keeps apexlite's amp (`from apexlite import amp`) or becomes bf16 autocast."""

    opt_level: Optional[str] = None
    loss_scale: Optional[str] = None
    o2: str = O2_APEXLITE
