"""Stand-in for `apex_C` in a child of `apexlite run`: installs the import hook, then hands over."""
from apexlite.compat import hook

hook.replace_stand_in(__name__)
