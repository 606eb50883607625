"""`python -m apex.parallel.multiproc`: apex's old one-process-per-GPU launcher; use torchrun.

apex's module launched the processes as it was imported; apexlite's raises when run, and its other
names (argslist, world_size, ...) come from the table as placeholders that raise with the same advice.
"""
from apexlite.compat import generic
from apexlite.compat._unsupported import ApexliteUnsupportedError, unsupported_message

ADVICE = ("Launch with `torchrun --nproc-per-node=N -m apexlite run main.py ...` (each process reads "
          "RANK/WORLD_SIZE/LOCAL_RANK from the environment) instead of `python -m apex.parallel.multiproc`.")


def main() -> None:
    raise ApexliteUnsupportedError(unsupported_message("apex.parallel.multiproc", ADVICE))


__getattr__ = generic.fallback_getattr(__name__)

if __name__ == "__main__":  # `python -m apex.parallel.multiproc ...` (under `apexlite run` or the alias)
    raise SystemExit(unsupported_message("apex.parallel.multiproc", ADVICE))
