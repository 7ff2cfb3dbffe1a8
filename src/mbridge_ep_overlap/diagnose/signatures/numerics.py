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
