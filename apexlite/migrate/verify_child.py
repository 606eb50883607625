"""Runs a migrated script for `migrate --verify`, in its own Python process, recording what the sweep's
telemetry records for an apex script: the loss of every backward pass with the loss scale that multiplied
it, the optimizer steps and which of them GradScaler skipped, ending the script cleanly after N steps.

    python verify_child.py --telemetry FILE --max-steps N [--static-scale S] [--allow MODULE] [--path0 DIR]
                           SCRIPT [ARGS...]
    python verify_child.py --no-record [--allow apexlite] SCRIPT [ARGS...]   (amp kept on apexlite: its own
                                                                            telemetry records the run)

This file imports nothing of apexlite: it is run by path, and `apex`, `amp_C` and (unless --allow
apexlite) `apexlite` are refused by a finder placed first on sys.meta_path, so whatever is installed,
the migrated script runs on torch alone; every refused import is listed in the report. Losses come
from torch.amp.GradScaler.scale (the unscaled loss it is given, and the scaler's scale) and from
`.backward()` on a one-element tensor that no GradScaler produced (scale None); steps from torch's
global optimizer step hook, plus one per GradScaler.step (a step it skips for inf/NaN gradients counts
too, as apexlite's telemetry counts it, and is listed in `skipped_at`). `--static-scale S` makes every
GradScaler static: it starts at S and `update()` sets S again (the counterpart of APEXLITE_LOSS_SCALE=S
for the original), so two runs can be compared with loss scaling taken out of the difference.
"""
import argparse
import importlib.abc
import importlib.util
import inspect
import json
import os
import runpy
import signal
import sys
import traceback

REFUSED_ROOTS = ("apex", "amp_C", "apexlite")
LAYER_PRECISION = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "amp", "layer_precision.py")
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
        self.losses = []  # (step the loss feeds, detached loss, detached scale or None): no host sync
        self.skipped_at = []
        self.inside_scaler_step = False
        self.applied_inside_scaler_step = False

    def record(self, loss, scale=None):
        self.losses.append((self.steps + 1, loss.detach(), scale))

    def count_step(self, skipped=False):
        self.steps += 1
        if skipped:
            self.skipped_at.append(self.steps)
        if self.max_steps is not None and self.steps >= self.max_steps:
            self.cut_at_budget = True
            raise BudgetReached()

    def report(self, finder, exit_code):
        curve, scales = [], []
        for step, loss, scale in self.losses:
            value = float(loss.float().mean())
            curve.append([step, value if value == value and abs(value) != float("inf") else None])
            scales.append([step, None if scale is None else float(scale)])
        return {"loss_curve": curve, "loss_scale_curve": scales, "skipped_at": self.skipped_at,
                "steps": self.steps, "cut_at_budget": self.cut_at_budget,
                "max_steps": self.max_steps, "refused_imports": finder.attempts, "exit_code": exit_code,
                "loaded_refused_modules": sorted(name for name in sys.modules
                                                 if name.split(".")[0] in finder.roots)}


def _current_scale(scaler):
    """The scaler's scale as a detached copy (its tensor changes in place at update), or None if disabled."""
    if not scaler.is_enabled():
        return None
    scale = getattr(scaler, "_scale", None)
    return scale.detach().clone() if scale is not None else scaler.get_scale()


def make_static(scaler_class, static_scale):
    """Every GradScaler starts at `static_scale` and goes back to it at each update (it still skips a step
    whose gradients overflowed, as a static apex/apexlite scaler does)."""
    original_init, original_update = scaler_class.__init__, scaler_class.update
    signature = inspect.signature(original_init)

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["init_scale"] = static_scale
        original_init(*bound.args, **bound.kwargs)

    def update(self, new_scale=None):
        return original_update(self, static_scale if self.is_enabled() else new_scale)

    scaler_class.__init__, scaler_class.update = __init__, update


def install(recorder, static_scale=None):
    """Wrap GradScaler.scale/step and Tensor.backward; hook every optimizer's step (process-wide)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    scaler_class = torch.amp.GradScaler
    original_scale, original_step = scaler_class.scale, scaler_class.step
    original_backward = torch.Tensor.backward
    if static_scale is not None:
        make_static(scaler_class, static_scale)

    def scale(self, outputs):
        scaled = original_scale(self, outputs)
        if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
            recorder.record(outputs, _current_scale(self))
        if isinstance(scaled, torch.Tensor):
            setattr(scaled, SCALED_MARK, True)
        return scaled

    def step(self, optimizer, *args, **kwargs):
        recorder.inside_scaler_step, recorder.applied_inside_scaler_step = True, False
        try:
            result = original_step(self, optimizer, *args, **kwargs)
        finally:
            recorder.inside_scaler_step = False
        recorder.count_step(skipped=not recorder.applied_inside_scaler_step)
        return result

    def backward(self, *args, **kwargs):
        if self.numel() == 1 and not getattr(self, SCALED_MARK, False):
            recorder.record(self)
        return original_backward(self, *args, **kwargs)

    def after_step(optimizer, args, kwargs):
        if recorder.inside_scaler_step:
            recorder.applied_inside_scaler_step = True
        else:
            recorder.count_step()

    scaler_class.scale, scaler_class.step = scale, step
    torch.Tensor.backward = backward
    register_optimizer_step_post_hook(after_step)


def count_layer_dtypes():
    """apexlite.amp.layer_precision, loaded by path (apexlite may be refused here), counts when verify asks."""
    spec = importlib.util.spec_from_file_location("_apexlite_verify_layer_precision", LAYER_PRECISION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install_from_environment()


def _parse(argv):
    parser = argparse.ArgumentParser(prog="verify_child.py")
    parser.add_argument("--telemetry")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--static-scale", type=float, default=None)
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
        install(recorder, options.static_scale)
    count_layer_dtypes()
    sys.argv = [options.script, *options.args]
    sys.path[0] = options.path0 or os.path.dirname(os.path.abspath(options.script))
    exit_code = 0
    try:
        runpy.run_path(options.script, run_name="__main__")
    except BudgetReached:
        exit_code = 0
    except SystemExit as error:
        exit_code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
        if not isinstance(error.code, int) and error.code is not None:
            print(error.code, file=sys.stderr)  # as python prints sys.exit("message")
    except BaseException:  # the script's own failure: print it as python would, then report
        traceback.print_exc()
        exit_code = 1
    write(exit_code)
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
