"""Interpreter start-up of every Python process an `apexlite run` starts (this folder is on its PYTHONPATH).

Python imports `sitecustomize` while it starts; this one puts `DeferredApexFinder` first on
`sys.meta_path`, so in the child `apex`, `amp_C` and apex's other top-level modules (LEGACY_TOP_LEVEL,
REFUSED_EXTENSIONS below) resolve to apexlite ahead of anything on `sys.path`
(a local `apex/` folder next to the child's script included), as they do in the run's own process,
and `importlib.metadata` finds the `apex` distribution there too. It imports nothing from apexlite (or
torch) until a legacy name is imported, so children that never touch apex start as fast as before.
Then it runs the next `sitecustomize` on the path, if any, so a site's own start-up code still runs.

Importing this file under any other name (apexlite.compat.hook reuses `ApexDistribution`) only
defines things: the start-up work runs when it is imported as `sitecustomize`.
"""
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import sys

# apex's top-level modules apexlite provides: the apex package and the compiled extensions it implements
# (apexlite/compat/<name>.py); tests/compat/test_extension_modules.py checks these against apex_tree.tsv
LEGACY_TOP_LEVEL = (
    "apex", "amp_C", "apex_C", "fused_adam_cuda", "fused_lamb_cuda", "fused_layer_norm_cuda",
    "fused_weight_gradient_mlp_cuda", "generic_scaled_masked_softmax_cuda", "scaled_masked_softmax_cuda",
    "scaled_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda", "syncbn",
)
# apex's other compiled extensions: under apexlite, importing one that nothing else provides raises the
# ModuleNotFoundError of an apex built without it, naming the alternative
REFUSED_EXTENSIONS = (
    "_apex_gpu_direct_storage", "_apex_nccl_allocator", "bnp", "cudnn_gbn_lib", "distributed_adam_cuda",
    "distributed_lamb_cuda", "fast_bottleneck", "fast_layer_norm", "fast_multihead_attn", "fmhalib", "focal_loss_cuda",
    "fused_conv_bias_relu", "fused_dense_cuda", "fused_index_mul_2d", "fused_rotary_positional_embedding",
    "group_norm_cuda", "group_norm_v2_cuda", "mlp_cuda", "nccl_p2p_cuda", "peer_memory_cuda", "permutation_search_cuda",
    "transducer_joint_cuda", "transducer_loss_cuda", "xentropy_cuda",
)
# apex's own setup.py said version "0.1"; the local label says who provides it (PEP 440: 0.1 <= this).
APEX_DISTRIBUTION_VERSION = "0.1+apexlite"
# what `python -m apexlite alias install` writes into site-packages; found there, it answers for apex itself
ALIAS_DIST_INFO = f"apex-{APEX_DISTRIBUTION_VERSION}.dist-info"
_METADATA = (
    "Metadata-Version: 2.1\n"
    "Name: apex\n"
    f"Version: {APEX_DISTRIBUTION_VERSION}\n"
    "Summary: NVIDIA apex's legacy API (amp, optimizers, parallel, fp16_utils, ...) provided by apexlite "
    "inside `python -m apexlite run`\n"
)
_COMPAT_DIR = pathlib.Path(__file__).resolve().parent.parent  # apexlite/compat, where apex/ and amp_C live


class ApexDistribution(importlib.metadata.Distribution):
    """The `apex` distribution as `importlib.metadata` reports it inside a run (no files on disk)."""

    def read_text(self, filename):
        return {"METADATA": _METADATA, "top_level.txt": "\n".join(LEGACY_TOP_LEVEL) + "\n"}.get(filename)

    def locate_file(self, path):
        return _COMPAT_DIR / path


def apex_distributions(context):
    """`[ApexDistribution()]` when `context` asks for apex (or for every distribution), else [].

    Also [] where apexlite's alias is installed on the path searched: its dist-info on disk answers.
    """
    name = getattr(context, "name", None)
    if name is not None and re.sub(r"[-_.]+", "_", name).lower() != "apex":
        return []
    if any(os.path.isdir(os.path.join(entry or os.curdir, ALIAS_DIST_INFO)) for entry in context.path):
        return []
    return [ApexDistribution()]


class DeferredApexFinder(importlib.abc.MetaPathFinder):
    """Answers for apex until a legacy module is imported, then hands over to apexlite's import hook."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in LEGACY_TOP_LEVEL and name not in REFUSED_EXTENSIONS:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        try:
            from apexlite.compat import hook
        except ImportError:  # an interpreter without apexlite: leave apex to the normal import system
            return None
        return hook.ensure_installed().find_spec(name, path, target)

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        return apex_distributions(context)


def _run_next_sitecustomize():
    """Execute the `sitecustomize` this one shadows (the next on sys.path), as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    sys.meta_path.insert(0, DeferredApexFinder())
    _run_next_sitecustomize()
