"""Silent fallback: MB's ``apply_flex_dispatcher_backend`` logs one warning on rank 0 and trains with
the alltoall dispatcher when the GPU does not support the requested flex backend; the run succeeds
and is slower than asked for. The patterns hold the warning's fixed words and skip what varies or what a
quote abridges between them (the GPU's name, "..."), so a pasted or trimmed warning is still named.
Transformer Engine's attention falls back too: ``TE_ATTENTION_UNFUSED`` when it runs UnfusedDotProductAttention,
``TE_FP8_ATTENTION_DISABLED`` when it disables the FP8 attention asked for (``diagnose.attention_backends``)."""

from __future__ import annotations

from .base import TE_AT, Signature, github_blob

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

_DPA = "transformer_engine/pytorch/attention/dot_product_attention/"
TE_ATTENTION_READ = ("Transformer Engine 1.9 to 2.18 (get_attention_backend's debug lines and DotProductAttention's INFO "
                     "line; the reasons' wording is quoted at v2.18 and changes between releases)")

TE_ATTENTION_UNFUSED = Signature(
    id="te-attention-unfused", symptom="fallback", patterns=(),
    cause="Transformer Engine runs attention with UnfusedDotProductAttention: it disabled FusedAttention (cuDNN) and "
          "FlashAttention for the run's inputs, each for the reason its log gives ('Disabling BACKEND REASON', logged at "
          "NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2), and went on unfused.",
    fix="give a fused backend an input it supports, as its reason says (the shape or dtype of its 'Found:' part, an "
        "NVTE_*_ATTN=0 switch, the cuDNN kernel it lacks); unfused attention materialises the s x s scores: slower, "
        "far more memory",
    source=github_blob(TE_AT, _DPA + "dot_product_attention.py") + "#L1668-L1679",
    emitted=("Running with UnfusedDotProductAttention backend",), confidence=0.9, found_by="attention-backend",
    excerpts=(f"{TE_AT}:{_DPA}dot_product_attention.py:1668-1679", f"{TE_AT}:{_DPA}utils.py:448-448",
              f"{TE_AT}:{_DPA}utils.py:464-473", f"{TE_AT}:{_DPA}utils.py:555-562",
              f"{TE_AT}:{_DPA}utils.py:857-866", f"{TE_AT}:{_DPA}utils.py:885-901", f"{TE_AT}:{_DPA}utils.py:1399-1402",
              f"{TE_AT}:{_DPA}utils.py:1491-1522", f"{TE_AT}:{_DPA}utils.py:1540-1552",
              f"{TE_AT}:{_DPA}utils.py:1568-1575"),
    versions=TE_ATTENTION_READ)

TE_FP8_ATTENTION_DISABLED = Signature(
    id="te-fp8-attention-disabled", symptom="fallback", patterns=(),
    cause="FP8 attention was asked for (fp8_dpa; Megatron-Core's fp8_dot_product_attention) and Transformer Engine "
          "disabled FusedAttention, its FP8 attention path, for an FP8 reason (the recipe on this arch, the cuDNN "
          "version, determinism): another backend ran, or none was left.",
    fix="the reason names what FP8 attention needs: on Hopper, current scaling and MXFP8 attention need sm100+, so set "
        "NVTE_DPA_FP8_RECIPE=DelayedScaling (FP8 attention with delayed scaling) or F16 (attention in BF16); a cuDNN "
        "too old for the recipe needs the version it names",
    source=github_blob(TE_AT, _DPA + "utils.py") + "#L566-L655",
    emitted=("Disabling FusedAttention for FP8 current scaling on arch < sm100",), confidence=0.9,
    found_by="attention-backend",
    excerpts=(f"{TE_AT}:{_DPA}utils.py:566-592", f"{TE_AT}:{_DPA}utils.py:593-655"), versions=TE_ATTENTION_READ)

SIGNATURES = (
    UPSTREAM_FALLBACK,
    TE_ATTENTION_UNFUSED,
    TE_FP8_ATTENTION_DISABLED,
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
