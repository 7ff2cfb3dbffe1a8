"""Wrong numerics, read from MB's iteration lines (``diagnose.iterations``): NaN/Inf losses, NaN or
skipped iterations, grad-norm blow-ups and loss spikes. The thresholds live in ``iterations``."""

from __future__ import annotations

from .base import Signature

_TRAIN = "installed:megatron/bridge/training/utils/train_utils.py"
_FIX = ("compare with the same run with overlap off (verify-log OFF.log ON.log); if only the overlap run "
        "diverges, report it upstream with both logs; check the loss scale and the learning-rate warm-up")

SIGNATURES = (
    Signature(
        id="non-finite-loss-detected", symptom="numerics",
        patterns=(r"iteration \d+: Unexpected result (nan|inf|-inf) ",),
        cause="MCore's rerun state machine found a NaN/Inf loss or grad norm at the iteration it names and "
              "stopped the rank (check_for_nan_in_loss_and_grad); the other ranks then wait for it in the next "
              "collective, so the run looks like a hang - the NaN is the cause.",
        fix=_FIX, source="installed:megatron/core/rerun_state_machine.py",
        emitted=("RuntimeError: Rank 0, node vm, device 0, iteration 5: Unexpected result nan "
                 "(message='found NaN in local forward loss calculation')",),
        confidence=0.92, versions="megatron-core 0.10+"),
    Signature(
        id="nan-iterations", symptom="numerics",
        patterns=(r"number of nan iterations:\s+[1-9][0-9]*",),
        cause="MB counted iterations whose gradients held NaN/Inf (the optimizer step was skipped): the "
              "loss or the gradients overflowed.", fix=_FIX, source=_TRAIN,
        emitted=(" number of nan iterations:   3 |",), confidence=0.7, found_by="numerics"),
    Signature(
        id="non-finite-loss", symptom="numerics", patterns=(),
        cause="A logged loss is NaN, Inf or not a number.", fix=_FIX, source=_TRAIN,
        emitted=(" lm loss: inf |",), confidence=0.7, found_by="numerics"),
    Signature(
        id="grad-norm-blowup", symptom="numerics", patterns=(),
        cause="The grad norm jumped far above its earlier values (or is not finite) while the run went on: "
              "training is diverging. Seen with HybridEP and EP overlap on DeepSeek-V3 (cause open upstream).",
        fix=_FIX, source="https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/2403",
        emitted=(" loss scale: 1.0 | grad norm: 224119.688 | number of skipped iterations:   0 |",),
        confidence=0.6, found_by="numerics"),
    Signature(
        id="loss-spike", symptom="numerics", patterns=(),
        cause="The loss rose far above its recent values: a loss spike.", fix=_FIX, source=_TRAIN,
        emitted=(" lm loss: 1.890000E+01 |",), confidence=0.5, found_by="numerics"),
)

GRAD_NORM_DIFFERS = Signature(
    id="grad-norm-differs-across-ranks", symptom="numerics", patterns=(),
    cause="Ranks print different values for the gradient norm that clipping uses, which must be one number for the "
          "whole model: part of it was reduced over a smaller group than the parameters it clips - typically the "
          "expert parameters' share, sharded over the EP axis and not all-reduced across it - so each EP (or data-"
          "parallel) group clips the shared parameters by its own factor and the replicas drift apart silently.",
    fix="reduce every parameter's share of the norm over the group that holds it (the EP group for experts) before "
        "summing; in Megatron-Core the distributed optimizer's grad-norm all-reduce does this - a framework that "
        "clips itself must add the EP all-reduce; compare the norm on every rank after the fix",
    source="installed:mbridge_ep_overlap/diagnose/rank_norms.py (per-rank norm lines, read in its test)", emitted=(),
    confidence=0.55, found_by="rank-norms", versions="any framework that prints the norm per rank")

SIGNATURES += (GRAD_NORM_DIFFERS,)
