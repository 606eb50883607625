"""`apex.amp.__version__`: amp's version, 0.1.0 as in apex."""
VERSION = (0, 1, 0)
__version__ = ".".join(str(part) for part in VERSION)
