"""Unsupported hardware: MB's ``validate_flex_dispatcher_backend`` refuses a flex backend on a GPU it
does not support (raised at finalize or model build, not a fallback); Transformer Engine refuses FP8 on a GPU
without FP8 Tensor Cores; NVSHMEM skips NICs that are not mlx5 devices (its IBGDA transport drives only those)."""

from __future__ import annotations

from .base import DEEPEP_AT, HYBRID_EP_AT, TE_AT, Signature, github_blob

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

_TE_V0_6 = "NVIDIA/TransformerEngine@f18e6773d9ed1aca1f497f6a2d3a927a21a372ea"
"""Transformer Engine v0.6, the last release that allowed FP8 on compute capability 9.x only."""
_TE_FP8_SUPPORT = f"{TE_AT}:transformer_engine/pytorch/quantization.py:148-157"

SIGNATURES += (
    Signature(
        id="te-fp8-needs-compute-capability-8-9", symptom="hardware",
        patterns=(r"Device compute capability (?:8\.9 or higher|9\.x) required for FP8 execution",),
        cause="FP8 was asked for (fp8_autocast / autocast with an FP8 recipe, Megatron's fp8 setting) on a GPU without "
              "FP8 Tensor Cores: Transformer Engine runs FP8 on compute capability 8.9 (Ada) and newer, so Ampere "
              "(A100 sm_80, RTX 3090 sm_86) and older are refused; Transformer Engine 0.6 and older allowed FP8 on "
              "9.x (Hopper) only, so it refused Ada too.",
        fix="run without FP8 on this GPU (bf16: no fp8 recipe, fp8_autocast(enabled=False)), or run FP8 on Ada, Hopper "
            "or Blackwell GPUs; on Ada use Transformer Engine 0.7 or newer with CUDA 12.1 or newer",
        source=github_blob(TE_AT, "transformer_engine/pytorch/quantization.py") + "#L153-L154",
        emitted=("AssertionError: Device compute capability 8.9 or higher required for FP8 execution.",
                 "AssertionError: Device compute capability 9.x required for FP8 execution."),
        excerpts=(_TE_FP8_SUPPORT, f"{_TE_V0_6}:transformer_engine/pytorch/fp8.py:238-241"),
        confidence=0.95, rule="fp8-needs-compute-capability-8-9",
        versions="'8.9 or higher': Transformer Engine 0.7 to 2.18 (quantization.py, fp8.py before 2.9); "
                 "'9.x': Transformer Engine 0.6 and older"),
    Signature(
        id="te-fp8-on-ada-needs-cuda-12-1", symptom="hardware",
        patterns=(r"(?:CublasLt version 12\.1\.3\.x|Cuda version 12\.1) or higher required for FP8 execution on Ada",),
        cause="FP8 on an Ada GPU (compute capability 8.9) with a CUDA or cuBLASLt older than 12.1(.3): Ada's FP8 GEMMs "
              "came with the cuBLASLt of CUDA 12.1 Update 1, so Transformer Engine refuses FP8 below it.",
        fix="use CUDA 12.1 Update 1 or newer (torch built for it, and its cuBLAS), or run without FP8 on this GPU",
        source=github_blob(TE_AT, "transformer_engine/pytorch/quantization.py") + "#L155-L158",
        emitted=("AssertionError: CublasLt version 12.1.3.x or higher required for FP8 execution on Ada.",
                 "AssertionError: Cuda version 12.1 or higher required for FP8 execution on Ada."),
        excerpts=(_TE_FP8_SUPPORT,), confidence=0.95, versions="Transformer Engine 0.7 to 2.18"),
)

_NVSHMEM_IBGDA = "installed:nvidia/nvshmem/lib/nvshmem_transport_ibgda.so.3"

SIGNATURES += (
    Signature(
        id="nvshmem-nic-not-mlx5", symptom="hardware",
        patterns=(r"device \S+ is not enumerated as an mlx5 device\. Skipping", r"\(not an mlx5 device\)"),
        cause="NVSHMEM's IBGDA transport (GPU-initiated RDMA, which DeepEP's internode and low-latency kernels use) "
              "drives the NIC through mlx5 direct verbs, so it works only on NVIDIA/Mellanox mlx5 NICs: it skips every "
              "device it does not find as mlx5 (another driver, such as Alibaba's erdma, or NICs renamed from mlx5_N "
              "so that NVSHMEM no longer enumerates them as mlx5), and with every NIC skipped the internode dispatch "
              "has no NIC: its receive counters never arrive (-1) or the buffer cannot be created.",
        fix="run DeepEP's internode / low-latency modes on mlx5 NICs (ConnectX / BlueField, driver mlx5_core: "
            "`ls -l /sys/class/infiniband/*/device/driver`) under the names rdma-core gives them (mlx5_N), or name them "
            "for NVSHMEM (NVSHMEM_HCA_LIST, NVSHMEM_ENABLE_NIC_PE_MAPPING); on other NICs use DeepEP's normal mode "
            "within a node or another dispatcher",
        source=_NVSHMEM_IBGDA,
        emitted=("WARN: device roce_rail1 is not enumerated as an mlx5 device. Skipping...",),
        confidence=0.91, rule="deepep-built-with-nvshmem", versions="NVSHMEM 3.x (the installed wheel: 3.4.5)"),
)

SIGNATURES += (
    Signature(
        id="hybridep-fabric-memory-not-permitted", symptom="hardware",
        patterns=(r"call='cuMem(?:Create|ExportToShareableHandle|ImportFromShareableHandle)\([^']*fabric[^']*'\s*"
                  r"Reason=operation not permitted",),
        cause="HybridEP allocates its buffers as CUDA fabric memory (CU_MEM_HANDLE_TYPE_FABRIC, the multi-node NVLink "
              "handles of NVL72-class systems such as GB200 / GB300, which need an IMEX channel); this node's driver "
              "did not permit it: the GPUs are not in a multi-node NVLink domain (HGX B200 / H100 / H200), or the "
              "process has no IMEX channel.",
        fix="on a node whose NVLink domain is the node itself, run HybridEP with USE_MNNVL=0 (its allocator then "
            "uses cudaMalloc and CUDA IPC handles: csrc/hybrid_ep/allocator/allocator.cu reads it at start); on "
            "NVL72 give the job an IMEX channel; `mbridge-ep-overlap doctor --smoke` tries HybridEP both ways and "
            "says which works",
        source=github_blob(HYBRID_EP_AT, "csrc/hybrid_ep/allocator/allocator.cu"),
        emitted=("CU error encountered at: file=/opt/DeepEP/csrc/hybrid_ep/allocator/allocator.cu line=91, "
                 "call='cuMemCreate(&handle, size, &fabric_prop_, 0)' Reason=operation not permitted.",),
        quote="    CU_CHECK(cuMemCreate(&handle, size, &fabric_prop_, 0));",
        quoted_at=f"{HYBRID_EP_AT}:csrc/hybrid_ep/allocator/allocator.cu:91",
        confidence=0.85, versions="DeepEP hybrid-ep branch (HybridEP's ExtendedMemoryAllocator)"),
)
