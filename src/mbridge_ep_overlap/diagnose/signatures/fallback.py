"""Silent fallback: MB's ``apply_flex_dispatcher_backend`` logs one warning on rank 0 and trains with
the alltoall dispatcher when the GPU does not support the requested flex backend; the run succeeds
and is slower than asked for. The patterns hold the warning's fixed words and skip what varies or what a
quote abridges between them (the GPU's name, "..."), so a pasted or trimmed warning is still named."""

from __future__ import annotations

from .base import Signature

_FLEX = "installed:megatron/bridge/training/flex_dispatcher_backend.py"
_MB = "megatron-bridge 0.2+ (apply_flex_dispatcher_backend)"


def _still_flex(facts: dict) -> bool | None:
    """The rule passes when the dispatcher the process really ran is still flex."""
    kind = facts.get("moe_token_dispatcher_type")
    return None if kind is None else kind == "flex"


UPSTREAM_FALLBACK = Signature(
    id="upstream-fallback", symptom="fallback", patterns=(),
    cause="A warning of Megatron-Core or Megatron-Bridge that says the run goes on with a fallback (another "
          "dispatcher, an unfused kernel, a feature disabled): the warning is found in the installed source, and "
          "the condition it is issued under is why.",
    fix="make the condition the source falls back on false ('the warning at FILE:LINE is issued when "
        "CONDITION'), or accept the fallback knowingly",
    source="installed:mbridge_ep_overlap/diagnose/upstream_fallbacks.py", emitted=(), confidence=0.7,
    found_by="upstream-source",
    versions="the installed megatron-core / megatron-bridge (their warnings, read from the source)")

SIGNATURES = (
    UPSTREAM_FALLBACK,
    Signature(
        id="deepep-fell-back-to-alltoall", symptom="fallback",
        patterns=(r"DeepEP is only applicable to Ampere, Hopper, and Blackwell \(B200/B300\) GPUs\b.*"
                  r"Falling back to alltoall",),
        cause="DeepEP was requested on a GPU MB does not run it on (GB200/GB300 and others outside "
              "compute capability 8/9, B200, B300): MB switched the dispatcher to alltoall and went on.",
        fix="on GB200/GB300 use the hybridep backend (enable_ep_overlap(cfg, 'hybridep')); "
            "`plan --gpu <gpu>` refuses the DeepEP request up front",
        source=_FLEX,
        emitted=("DeepEP is only applicable to Ampere, Hopper, and Blackwell (B200/B300) GPUs. "
                 "Current GPU: NVIDIA GB200. Falling back to alltoall.",),
        confidence=0.95, rule="flex-backend-gpu", versions=_MB, facts_pass=_still_flex),
    Signature(
        id="hybridep-fell-back-to-alltoall", symptom="fallback",
        patterns=(r"HybridEP is only applicable for GB200, GB300 with NVL72 and for Ampere, Hopper, B200 and B300 "
                  r"GPUs\b.*Falling back to alltoall",),
        cause="HybridEP was requested on a GPU outside compute capability 8/9/10: MB switched the dispatcher "
              "to alltoall and went on.",
        fix="choose the alltoall dispatcher explicitly on this GPU, or run on a GPU HybridEP supports",
        source=_FLEX,
        emitted=("HybridEP is only applicable for GB200, GB300 with NVL72 and for Ampere, Hopper, B200 and B300 "
                 "GPUs. Current GPU: Tesla V100-SXM2-32GB. Falling back to alltoall.",),
        confidence=0.95, rule="flex-backend-gpu", versions=_MB, facts_pass=_still_flex),
    Signature(
        id="ncclep-fell-back-to-alltoall", symptom="fallback",
        patterns=(r"NCCL EP is only applicable to Hopper and Blackwell GPUs\b.*Falling back to alltoall",),
        cause="The NCCL EP backend was requested on a GPU before Hopper: MB switched to alltoall and went on.",
        fix="choose alltoall or deepep on Ampere; NCCL EP needs Hopper or Blackwell",
        source=_FLEX,
        emitted=("NCCL EP is only applicable to Hopper and Blackwell GPUs. Current GPU: NVIDIA A100-SXM4-80GB. "
                 "Falling back to alltoall.",),
        confidence=0.95, rule="flex-backend-gpu", versions="megatron-bridge 0.6+", facts_pass=_still_flex),
)
