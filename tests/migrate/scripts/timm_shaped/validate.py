import argparse
from contextlib import suppress

import torch
import torch.nn as nn

try:
    from apex import amp
except ImportError:
    amp = None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--apex-amp", action="store_true")
    args = parser.parse_args()
    bench = nn.Linear(16, 4).cuda()
    amp_autocast = suppress
    if args.apex_amp:
        bench = amp.initialize(bench, opt_level="O1")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(8, 16).cuda()
            with amp_autocast():
                output = bench(x)
            print(output.dtype)


if __name__ == "__main__":
    main()
