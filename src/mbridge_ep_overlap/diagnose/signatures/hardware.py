"""Unsupported hardware: MB's ``validate_flex_dispatcher_backend`` refuses a flex backend on a GPU it
does not support (raised at finalize or model build, not a fallback)."""

from __future__ import annotations

from .base import DEEPEP_AT, Signature, github_blob

_FLEX = "installed:megatron/bridge/training/flex_dispatcher_backend.py"

SIGNATURES = (
    Signature(
        id="hybridep-unsupported-gpu", symptom="hardware",
        patterns=(r"HybridEP is supported for GB200, GB300 with NVL72 and for Ampere, Hopper, B200 and B300 GPUs",),
        cause="The hybridep flex backend on a GPU outside compute capability 8/9/10.",
        fix="choose the alltoall dispatcher on this GPU", source=_FLEX,
        emitted=("ValueError: HybridEP is supported for GB200, GB300 with NVL72 and for Ampere, Hopper, B200 and "
                 "B300 GPUs",),
        confidence=0.9, rule="flex-backend-gpu", versions="megatron-bridge 0.3+"),
    Signature(
        id="ncclep-unsupported-gpu", symptom="hardware",
        patterns=(r"NCCL EP is supported for Hopper and Blackwell GPUs\. Current GPU:",),
        cause="The ncclep flex backend on a GPU before Hopper.",
        fix="choose alltoall or deepep on this GPU", source=_FLEX,
        emitted=("ValueError: NCCL EP is supported for Hopper and Blackwell GPUs. Current GPU: NVIDIA A100-SXM4-80GB",),
        confidence=0.9, rule="flex-backend-gpu", versions="megatron-bridge 0.6+"),
    Signature(
        id="deepep-unsupported-gpu-hopper-class", symptom="hardware",
        patterns=(r"DeepEP is supported for Ampere, Hopper, and Blackwell \(B200/B300\) GPUs\. Current GPU: "
                  r"(?!NVIDIA GB)",),
        cause="The deepep flex backend on a GPU DeepEP does not support.",
        fix="choose the alltoall dispatcher on this GPU (hybridep on GB200/GB300)", source=_FLEX,
        emitted=("ValueError: DeepEP is supported for Ampere, Hopper, and Blackwell (B200/B300) GPUs. "
                 "Current GPU: Tesla T4",),
        confidence=0.8, rule="flex-backend-gpu", versions="megatron-bridge 0.3+"),
)

SIGNATURES += (
    Signature(
        id="deepep-normal-mode-needs-8-nvlink-peers", symptom="hardware",
        patterns=(r"num_ranks > NUM_MAX_NVL_PEERS or low_latency_mode",),
        cause="DeepEP's normal (internode) kernels expect 8 NVLink peers per node; fewer GPUs per node (or one "
              "GPU per node) is a topology they do not support.",
        fix="run DeepEP's normal mode on nodes of 8 NVLink-connected GPUs, or use the alltoall dispatcher",
        source="https://github.com/deepseek-ai/DeepEP/issues/104",
        emitted=("RuntimeError: Failed: Assertion error /home1/DeepEP/csrc/deep_ep.cpp:32 "
                 "'num_ranks > NUM_MAX_NVL_PEERS or low_latency_mode'",),
        corpus_report="deepep-104", confidence=0.9, versions="DeepEP 1.x"),
)

SIGNATURES += (
    Signature(
        id="deepep-normal-mode-rank-limit", symptom="hardware",
        patterns=(r"num_ranks <= (?:LEGACY_)?NUM_MAX_NVL_PEERS \* (?:LEGACY_)?NUM_MAX_RDMA_PEERS",),
        cause="DeepEP's normal (internode) mode supports at most NUM_MAX_NVL_PEERS x NUM_MAX_RDMA_PEERS ranks in "
              "one buffer (8 x 20 = 160: 20 nodes of 8 GPUs); a larger EP group (or a rank outside it) trips the "
              "buffer's assertion.",
        fix="keep the EP group within 160 ranks (expert_model_parallel_size x expert_tensor_parallel_size <= 160 "
            "for DeepEP's normal mode), use low-latency mode, or another dispatcher at that scale",
        source=github_blob(DEEPEP_AT, "csrc/deep_ep.cpp"),
        emitted=("RuntimeError: Failed: Assertion error /opt/DeepEP/csrc/deep_ep.cpp:29 '0 <= rank and rank < num_ranks "
                 "and (num_ranks <= NUM_MAX_NVL_PEERS * NUM_MAX_RDMA_PEERS or low_latency_mode)'",),
        quote="    EP_HOST_ASSERT(0 <= rank and rank < num_ranks and (num_ranks <= NUM_MAX_NVL_PEERS * NUM_MAX_RDMA_PEERS "
              "or low_latency_mode));",
        quoted_at=f"{DEEPEP_AT}:csrc/deep_ep.cpp:29",
        confidence=0.9, versions="DeepEP 1.x normal mode (NUM_MAX_RDMA_PEERS 20)"),
)
