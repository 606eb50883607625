"""migrate's tests need libcst (the `apexlite[migrate]` extra that scripts/setup.sh installs)."""
import pytest

pytest.importorskip("libcst", reason="apexlite migrate needs libcst: pip install 'apexlite[migrate]'")
