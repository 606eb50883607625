"""The choices a user gives `migrate` for what the script leaves to run time or to taste."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

O2_APEXLITE = "apexlite"
O2_BF16_AUTOCAST = "bf16-autocast"
O2_CHOICES = (O2_APEXLITE, O2_BF16_AUTOCAST)
# The largest relative loss difference `--verify` accepts by default. On the project's examples (20 steps,
# CPU), correct migrations differed from the original by at most 0.34% (O2 -> bf16 autocast against
# apexlite's O2 in bf16; 0.91% after 100 steps), O0/O1/O3 and O2 kept on apexlite by 0.000%; deliberately
# broken ones by 15.6% (stepping every micro-batch) to 324% (clipping before unscale_). MIGRATION.md has
# the table.
DEFAULT_TOLERANCE = 0.05


@dataclass(frozen=True)
class MigrateOptions:
    """opt_level / loss_scale: used where the script picks them at run time (`opt_level=args.opt_level`);
    o2: O2 keeps apexlite's amp (`from apexlite import amp`) or becomes bf16 autocast."""

    opt_level: Optional[str] = None
    loss_scale: Optional[str] = None
    o2: str = O2_APEXLITE
