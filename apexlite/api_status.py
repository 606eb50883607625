"""The status of legacy apex APIs in apexlite, as data: what `python -m apexlite check` reports.

MIGRATION.md's tables state the same statuses (tests/test_check.py walks them against this table).
An API not listed here gets its status from what it resolves to in apexlite.compat: an implementation
is "supported", a placeholder or nothing is "unsupported". A row with `members=True` also covers
every name below it (`apex.RNN` covers `apex.RNN.LSTM`). `RAISES_AT_O1` rows are torch APIs that O1
refuses for fp16/bf16 inputs, as apex did; `check` flags them wherever a script uses them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

from apexlite.amp.o1.lists import TABLES
from apexlite.amp.o1.policies import CastPolicy
from apexlite.compat.hook import UNSUPPORTED_AREAS

SUPPORTED = "supported"
DIFFERS = "differs"
UNSUPPORTED = "unsupported"
RAISES_AT_O1 = "raises at O1"
KINDS = (SUPPORTED, DIFFERS, UNSUPPORTED, RAISES_AT_O1)


@dataclass(frozen=True)
class ApiStatus:
    """One API (or, with `members`, a whole module) and how apexlite handles it."""

    api: str
    kind: str
    note: str = ""
    members: bool = False

    @property
    def text(self) -> str:
        """The status as `check` prints it: "supported" or "<kind>: <note>"."""
        return f"{self.kind}: {self.note}" if self.note else self.kind


_KERNEL_NORM = ("torch ops (fp32 statistics) instead of apex's CUDA kernel, same results; memory_efficient is "
                "accepted and has no effect")
_TORCH_OPT = "a torch implementation of apex's update rule, not a fused kernel; same results"
_AMP_C = "torch ops instead of apex's CUDA kernel, same results and shapes; chunk_size is accepted and unused"
_OPT_KERNEL = "apex's optimizer kernel is not exposed; use the optimizer class apex.optimizers.{}"
_LOGGER = "the module's functions and classes work as in apex; messages go to the apexlite logger, not print"
_BCE_FIX = ("under O1 it raises for fp16/bf16 inputs, as in apex: feed logits to torch.nn.BCEWithLogitsLoss / "
            "F.binary_cross_entropy_with_logits, or call amp.register_float_function(torch, 'sigmoid') before "
            "amp.initialize (O0/O2/O3 are unaffected)")


def _rows(kind: str, note: str, apis: Iterable[str], members: bool = False) -> Tuple[ApiStatus, ...]:
    return tuple(ApiStatus(api, kind, note, members) for api in apis)


TABLE: Tuple[ApiStatus, ...] = (
    # apex.amp
    ApiStatus("apex.amp.initialize", DIFFERS,
              "models may live on any device; O1 patches an updated op list (see MIGRATION.md); calling it again "
              "adds or replaces models/optimizers as apex allowed and amp.deinitialize() undoes every call; "
              "APEXLITE_OPT_LEVEL / APEXLITE_DTYPE may override opt_level and the fp16 dtype"),
    ApiStatus("apex.amp.scale_loss", DIFFERS,
              "an exception inside the block leaves unscaled grads and the scaler unchanged; "
              "delay_overflow_check is accepted and ignored (the check always runs); the dynamic scale has a "
              "floor of 2**-24 and a loss that stays inf/NaN stops the run with NonFiniteLossError"),
    ApiStatus("apex.amp.master_params", SUPPORTED),
    ApiStatus("apex.amp.state_dict", SUPPORTED),
    ApiStatus("apex.amp.load_state_dict", DIFFERS,
              "also accepts a torch.amp.GradScaler state dict; a loss scale that is not a finite positive number "
              "is rejected"),
    ApiStatus("apex.amp.disable_casts", DIFFERS,
              "per thread (other threads keep casting); casts are restored even when the block raises; "
              "leaving the block on another thread than the one that entered it is an error"),
    *_rows(SUPPORTED, "", ["apex.amp.half_function", "apex.amp.float_function", "apex.amp.promote_function",
                           "apex.amp.register_half_function", "apex.amp.register_float_function",
                           "apex.amp.register_promote_function", "apex.amp._amp_state"]),
    ApiStatus("apex.amp.init", SUPPORTED),
    *_rows(SUPPORTED, "", ["apex.amp.handle.AmpHandle", "apex.amp.handle.NoOpHandle"]),
    *_rows(DIFFERS, _LOGGER, ["apex.amp.frontend", "apex.amp.handle", "apex.amp.scaler", "apex.amp.amp"]),
    # apex.optimizers
    ApiStatus("apex.optimizers.FusedAdam", DIFFERS,
              "apexlite's own fused kernel; under O2 the fp32 masters live in optimizer.state[p]['master_param'] "
              "(see MIGRATION.md)"),
    ApiStatus("apex.optimizers.FusedSGD", DIFFERS, _TORCH_OPT + "; materialize_master_grads has no effect"),
    *_rows(DIFFERS, _TORCH_OPT, ["apex.optimizers.FusedLAMB", "apex.optimizers.FusedNovoGrad",
                                 "apex.optimizers.FusedAdagrad"]),
    ApiStatus("apex.optimizers.FusedMixedPrecisionLamb", DIFFERS,
              _TORCH_OPT + "; fp32 masters are saved in state_dict; after a GradScaler step .grad holds the "
              "unscaled gradient (apex left the update there)"),
    ApiStatus("apex.optimizers.FP16_Optimizer", UNSUPPORTED,
              "the pre-2019 wrapper; use apex.fp16_utils.FP16_Optimizer or amp.initialize(..., opt_level='O2')"),
    # apex.parallel
    ApiStatus("apex.parallel.DistributedDataParallel", DIFFERS,
              "built on torch DDP; delay_allreduce, allreduce_trigger_params, num_allreduce_streams, "
              "allreduce_communicators, retain_allreduce_buffers and prof only tuned overlap and are ignored "
              "(logged)"),
    ApiStatus("apex.parallel.SyncBatchNorm", DIFFERS,
              "torch.nn.SyncBatchNorm underneath; channel_last=True is refused (use torch.channels_last tensors)"),
    ApiStatus("apex.parallel.convert_syncbn_model", DIFFERS,
              "channel_last=True is refused (use torch.channels_last tensors)"),
    *_rows(SUPPORTED, "", ["apex.parallel.create_syncbn_process_group", "apex.parallel.Reducer",
                           "apex.parallel.ReduceOp", "apex.parallel.LARC"]),
    ApiStatus("apex.parallel.multiproc", UNSUPPORTED,
              "launch with torchrun --nproc-per-node=N -m apexlite run main.py", members=True),
    # apex.fp16_utils
    ApiStatus("apex.fp16_utils.FP16_Optimizer", DIFFERS,
              "messages go to the apexlite logger; inspect_master_grad_data is not provided"),
    ApiStatus("apex.fp16_utils.prep_param_lists", DIFFERS,
              "a mixed-dtype model with flat_master=True raises TypeError instead of printing"),
    *_rows(SUPPORTED, "", ["apex.fp16_utils.network_to_half", "apex.fp16_utils.tofp16",
                           "apex.fp16_utils.BN_convert_float", "apex.fp16_utils.convert_module",
                           "apex.fp16_utils.convert_network", "apex.fp16_utils.FP16Model",
                           "apex.fp16_utils.FP16_Module", "apex.fp16_utils.model_grads_to_master_grads",
                           "apex.fp16_utils.master_params_to_model_params", "apex.fp16_utils.to_python_float",
                           "apex.fp16_utils.clip_grad_norm", "apex.fp16_utils.LossScaler",
                           "apex.fp16_utils.DynamicLossScaler"]),
    # apex.normalization
    *_rows(DIFFERS, _KERNEL_NORM, [
        f"apex.normalization.{name}" for name in (
            "FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm", "fused_layer_norm",
            "fused_layer_norm_affine", "fused_rms_norm", "fused_rms_norm_affine",
            "mixed_dtype_fused_layer_norm_affine", "mixed_dtype_fused_rms_norm_affine")]),
    # apex.multi_tensor_apply and amp_C
    *_rows(DIFFERS, "always available (torch foreach ops, any device); chunk_size is accepted and unused",
           ["apex.multi_tensor_apply.multi_tensor_applier", "apex.multi_tensor_apply.MultiTensorApply"]),
    *_rows(DIFFERS, _AMP_C, ["amp_C.multi_tensor_scale", "amp_C.multi_tensor_axpby", "amp_C.multi_tensor_l2norm",
                             "amp_C.multi_tensor_unscale_l2norm"]),
    ApiStatus("amp_C.update_scale_hysteresis", DIFFERS,
              "a few torch ops on the device instead of apex's one kernel, same results; malformed state (wrong "
              "dtype or size) raises instead of being misread"),
    *(ApiStatus(f"amp_C.{kernel}", UNSUPPORTED, _OPT_KERNEL.format(optimizer)) for kernel, optimizer in (
        ("multi_tensor_sgd", "FusedSGD"), ("multi_tensor_adam", "FusedAdam"),
        ("multi_tensor_adam_capturable", "FusedAdam"), ("multi_tensor_adam_capturable_master", "FusedAdam"),
        ("multi_tensor_adagrad", "FusedAdagrad"), ("multi_tensor_novograd", "FusedNovoGrad"),
        ("multi_tensor_lamb", "FusedLAMB"), ("multi_tensor_lamb_stage1_cuda", "FusedLAMB"),
        ("multi_tensor_lamb_stage2_cuda", "FusedLAMB"), ("multi_tensor_lamb_mp", "FusedMixedPrecisionLamb"))),
    *_rows(UNSUPPORTED, "use amp_C.multi_tensor_l2norm (and amp_C.multi_tensor_scale for the scaled copy)",
           ["amp_C.multi_tensor_l2norm_mp", "amp_C.multi_tensor_l2norm_scale"]),
    ApiStatus("apex.RNN", UNSUPPORTED,
              "removed from apex with amp, and apex's own apex.RNN no longer imports on torch >= 1.x; use "
              "torch.nn.LSTM / GRU / RNN (same size arguments)", members=True),
    # areas outside apexlite: importable, every name raises when used, with this advice
    *(ApiStatus(f"apex.{area}", UNSUPPORTED, advice, members=True) for area, advice in UNSUPPORTED_AREAS.items()),
    # torch APIs O1 refuses for fp16/bf16 inputs: the banned functions of amp's op table, and the modules
    # that call them
    *_rows(RAISES_AT_O1, _BCE_FIX, [f"{namespace}.{name}" for namespace, names in TABLES[CastPolicy.BANNED].items()
                                    for name in names.split()]),
    ApiStatus("torch.nn.BCELoss", RAISES_AT_O1, _BCE_FIX),
)

_BY_API: Dict[str, ApiStatus] = {row.api: row for row in TABLE}


def lookup(api: str) -> Optional[ApiStatus]:
    """The row for `api` itself, or for the closest enclosing module row with `members=True`."""
    if api in _BY_API:
        return _BY_API[api]
    parts = api.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        row = _BY_API.get(".".join(parts[:depth]))
        if row is not None and row.members:
            return row
    return None


def raising_at_o1() -> Tuple[str, ...]:
    """The torch APIs `check` flags wherever they are used."""
    return tuple(row.api for row in TABLE if row.kind == RAISES_AT_O1)
