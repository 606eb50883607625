"""Runs a migrated script for `migrate --verify`, in its own Python process, recording what the sweep's
telemetry records for an apex script: the loss of every backward pass and the optimizer steps, ending
the script cleanly after N steps.

    python verify_child.py --telemetry FILE --max-steps N [--allow MODULE] [--path0 DIR] SCRIPT [ARGS...]
    python verify_child.py --no-record [--allow apexlite] SCRIPT [ARGS...]   (amp kept on apexlite: its own
                                                                            telemetry records the run)

This file imports nothing of apexlite: it is run by path, and `apex`, `amp_C` and (unless --allow
apexlite) `apexlite` are refused by a finder placed first on sys.meta_path, so whatever is installed,
the migrated script runs on torch alone; every refused import is listed in the report. Losses come
from torch.amp.GradScaler.scale (the unscaled loss it is given) and from `.backward()` on a one-element
tensor that no GradScaler produced; steps from torch's global optimizer step hook, plus one per
GradScaler.step (a step it skips for inf/NaN gradients counts too, as apexlite's telemetry counts it).
"""
import argparse
import importlib.abc
import json
import os
import runpy
import signal
import sys
import traceback

REFUSED_ROOTS = ("apex", "amp_C", "apexlite")
SCALED_MARK = "_apexlite_migrate_scaled"


class BudgetReached(SystemExit):
    """Raised by the step that completes the budget; the run ends with status 0."""

    def __init__(self):
        super().__init__(0)


class RefusingFinder(importlib.abc.MetaPathFinder):
    """Makes the refused top-level packages unimportable, and remembers each attempt."""

    def __init__(self, roots):
        self.roots = tuple(roots)
        self.attempts = []

    def find_spec(self, name, path=None, target=None):
        root = name.split(".")[0]
        if root in self.roots:
            self.attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} (apexlite migrate --verify runs the migrated "
                                      f"script without {root})", name=name)
        return None


class Recorder:
    """Losses by the step they feed, the step count, and the budget."""

    def __init__(self, max_steps):
        self.max_steps = max_steps
        self.steps = 0
        self.cut_at_budget = False
        self.losses = []  # (step the loss feeds, detached tensor): no host sync while training
        self.inside_scaler_step = False

    def record(self, loss):
        self.losses.append((self.steps + 1, loss.detach()))

    def count_step(self):
        self.steps += 1
        if self.max_steps is not None and self.steps >= self.max_steps:
            self.cut_at_budget = True
            raise BudgetReached()

    def report(self, finder, exit_code):
        curve = []
        for step, loss in self.losses:
            value = float(loss.float().mean())
            curve.append([step, value if value == value and abs(value) != float("inf") else None])
        return {"loss_curve": curve, "steps": self.steps, "cut_at_budget": self.cut_at_budget,
                "max_steps": self.max_steps, "refused_imports": finder.attempts, "exit_code": exit_code,
                "loaded_refused_modules": sorted(name for name in sys.modules
                                                 if name.split(".")[0] in finder.roots)}


def install(recorder):
    """Wrap GradScaler.scale/step and Tensor.backward; hook every optimizer's step (process-wide)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    scaler_class = torch.amp.GradScaler
    original_scale, original_step = scaler_class.scale, scaler_class.step
    original_backward = torch.Tensor.backward

    def scale(self, outputs):
        if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
            recorder.record(outputs)
        scaled = original_scale(self, outputs)
        if isinstance(scaled, torch.Tensor):
            setattr(scaled, SCALED_MARK, True)
        return scaled

    def step(self, optimizer, *args, **kwargs):
        recorder.inside_scaler_step = True
        try:
            result = original_step(self, optimizer, *args, **kwargs)
        finally:
            recorder.inside_scaler_step = False
        recorder.count_step()
        return result

    def backward(self, *args, **kwargs):
        if self.numel() == 1 and not getattr(self, SCALED_MARK, False):
            recorder.record(self)
        return original_backward(self, *args, **kwargs)

    def after_step(optimizer, args, kwargs):
        if not recorder.inside_scaler_step:
            recorder.count_step()

    scaler_class.scale, scaler_class.step = scale, step
    torch.Tensor.backward = backward
    register_optimizer_step_post_hook(after_step)


def _parse(argv):
    parser = argparse.ArgumentParser(prog="verify_child.py")
    parser.add_argument("--telemetry")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--allow", action="append", default=[], choices=REFUSED_ROOTS)
    parser.add_argument("--path0", default=None, help="sys.path[0] for the script (default: its directory)")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def main(argv):
    options = _parse(argv)
    if not options.no_record and not options.telemetry:
        raise SystemExit("verify_child.py: --telemetry FILE is needed unless --no-record")
    finder = RefusingFinder(root for root in REFUSED_ROOTS if root not in options.allow)
    sys.meta_path.insert(0, finder)
    recorder = Recorder(options.max_steps)

    def write(exit_code):
        if options.no_record:
            return
        partial = options.telemetry + ".partial"
        with open(partial, "w") as handle:
            json.dump(recorder.report(finder, exit_code), handle)
        os.replace(partial, options.telemetry)

    def on_sigterm(signum, frame):
        write(-signum)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    if not options.no_record:
        signal.signal(signal.SIGTERM, on_sigterm)
        install(recorder)
    sys.argv = [options.script, *options.args]
    sys.path[0] = options.path0 or os.path.dirname(os.path.abspath(options.script))
    exit_code = 0
    try:
        runpy.run_path(options.script, run_name="__main__")
    except BudgetReached:
        exit_code = 0
    except SystemExit as error:
        exit_code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    except BaseException:  # the script's own failure: print it as python would, then report
        traceback.print_exc()
        exit_code = 1
    write(exit_code)
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
