"""`apex.contrib`: the package itself imports, as in apex; each contrib area is either provided by apexlite
or refused at import (see apexlite/compat/apex_tree)."""
