"""`python -m apex.parallel.multiproc`: apex's old one-process-per-GPU launcher; use torchrun."""
from apexlite.compat._unsupported import ApexliteUnsupportedError, unsupported_message

ADVICE = ("Launch with `torchrun --nproc-per-node=N -m apexlite run main.py ...` (each process reads "
          "RANK/WORLD_SIZE/LOCAL_RANK from the environment) instead of `python -m apex.parallel.multiproc`.")


def main() -> None:
    raise ApexliteUnsupportedError(unsupported_message("apex.parallel.multiproc", ADVICE))


if __name__ == "__main__":
    main()
