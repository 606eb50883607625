"""Allows `python -m apexlite COMMAND`."""
import sys

from apexlite.cli import main

sys.exit(main())
