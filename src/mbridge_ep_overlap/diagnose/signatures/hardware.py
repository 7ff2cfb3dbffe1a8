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

_TE_BEFORE_2_9 = "NVIDIA/TransformerEngine@b840898b75162bce68fbc3c9c8234b6f23dcdbff"
"""Transformer Engine just before FP8 block scaling came to Blackwell (PR #2157, first in v2.9)."""
_TE_RECIPE_SUPPORT = "transformer_engine/pytorch/quantization.py"
BLACKWELL_GPUS = "B200 / GB200 10.0, B300 / GB300 10.3"
"""The data-centre Blackwell GPUs by compute capability (10.x), said by every row and reader that names them."""
RTX_BLACKWELL_GPUS = "RTX PRO 6000 and GeForce RTX 50 series 12.0, DGX Spark's GB10 12.1"
"""The RTX-class Blackwell GPUs by compute capability (12.x)."""
_ON_12 = (f"compute capability 12.x is the RTX-class Blackwell ({RTX_BLACKWELL_GPUS}), not the data-centre "
          f"Blackwell ({BLACKWELL_GPUS})")

SIGNATURES += (
    Signature(
        id="te-mxfp8-not-on-compute-capability-12", symptom="hardware",
        patterns=(r"MXFP8 \(for all gemm layouts\) is not supported on 12\.0\+ architectures",),
        cause="The MXFP8 recipe (MXFP8BlockScaling, Megatron's fp8_recipe='mxfp8') on a GPU of compute capability "
              f"12.x: Transformer Engine has no MXFP8 GEMMs there and refuses the recipe ({_ON_12}).",
        fix="on this GPU use a tensor-wise FP8 recipe (fp8_recipe='tensorwise' current scaling or 'delayed', "
            "compute capability 8.9 and newer) or bf16; run MXFP8 on B200 / B300 / GB200 / GB300",
        source=github_blob(TE_AT, _TE_RECIPE_SUPPORT) + "#L164-L165",
        emitted=("AssertionError: MXFP8 (for all gemm layouts) is not supported on 12.0+ architectures yet.",),
        excerpts=(f"{TE_AT}:{_TE_RECIPE_SUPPORT}:162-168",), confidence=0.95, rule="block-scaled-recipe-on-gpu",
        versions="Transformer Engine 2.6 to 2.18 (fp8.py before 2.9, quantization.py after)"),
    Signature(
        id="te-mxfp8-needs-compute-capability-10", symptom="hardware",
        patterns=(r"Device compute capability 10\.0 or higher required for MXFP8 execution",),
        cause="The MXFP8 recipe (MXFP8BlockScaling, Megatron's fp8_recipe='mxfp8') on a GPU before Blackwell: MXFP8's "
              f"block-scaled GEMMs are a Tensor Core feature of compute capability 10.x ({BLACKWELL_GPUS}), so "
              "Transformer Engine refuses it on Hopper (H100 / H200 9.0), Ada and older.",
        fix="on Hopper use fp8_recipe='blockwise' (FP8 with 1x128 / 128x128 scales, CUDA 12.9 or newer), "
            "'tensorwise' or 'delayed', or bf16 - NVIDIA's H100 perf recipes use FP8 current scaling where the "
            "Blackwell ones use MXFP8; run MXFP8 on B200 / B300 / GB200 / GB300",
        source=github_blob(TE_AT, _TE_RECIPE_SUPPORT) + "#L168",
        emitted=("AssertionError: Device compute capability 10.0 or higher required for MXFP8 execution.",),
        excerpts=(f"{TE_AT}:{_TE_RECIPE_SUPPORT}:162-168",), confidence=0.95, rule="block-scaled-recipe-on-gpu",
        versions="Transformer Engine 2.0 to 2.18"),
    Signature(
        id="te-nvfp4-needs-compute-capability-10", symptom="hardware",
        patterns=(r"Device compute capability 10\.0 or higher required for NVFP4 execution",),
        cause="The NVFP4 recipe (NVFP4BlockScaling, Megatron's fp4 settings) on a GPU before Blackwell: FP4 Tensor Cores "
              "exist from compute capability 10.x (B200 / GB200, B300 / GB300) on, so Transformer Engine refuses NVFP4 "
              "on Hopper and older.",
        fix="run NVFP4 on B200 / B300 / GB200 / GB300; on Hopper use an FP8 recipe (blockwise, tensorwise, delayed) or "
            "bf16",
        source=github_blob(TE_AT, _TE_RECIPE_SUPPORT) + "#L175",
        emitted=("AssertionError: Device compute capability 10.0 or higher required for NVFP4 execution.",),
        excerpts=(f"{TE_AT}:{_TE_RECIPE_SUPPORT}:171-175",), confidence=0.95, rule="block-scaled-recipe-on-gpu",
        versions="Transformer Engine 2.8 to 2.18"),
    Signature(
        id="te-fp8-block-scaling-needs-cuda-12-9", symptom="hardware",
        patterns=(r"FP8 block scaled GEMM requires (?:Hopper|compute capability 9\.0 or higher) and CUDA >= 12\.9",),
        cause="The FP8 block-scaling recipe (Float8BlockScaling, Megatron's fp8_recipe='blockwise', DeepSeek-V3 style "
              "1x128 / 128x128 scales) needs a GPU of compute capability 9.0 or newer and a torch built for CUDA 12.9 or "
              "newer (Transformer Engine tests torch.version.cuda, not the driver): one of the two is missing. Before "
              "Transformer Engine 2.9 the recipe ran on Hopper alone ('requires Hopper'), so Blackwell GPUs were "
              "refused too.",
        fix="check both: python -c 'import torch; print(torch.version.cuda, torch.cuda.get_device_capability())'; a "
            "torch built for CUDA 12.8 or older (cu126 / cu128 wheels) needs a cu129 / cu130 build (and a Transformer "
            "Engine built for it); on Blackwell with Transformer Engine before 2.9 upgrade it or use MXFP8",
        source=github_blob(TE_AT, _TE_RECIPE_SUPPORT) + "#L178-L185",
        emitted=("AssertionError: FP8 block scaled GEMM requires compute capability 9.0 or higher and CUDA >= 12.9.",
                 "AssertionError: FP8 block scaled GEMM requires Hopper and CUDA >= 12.9."),
        excerpts=(f"{TE_AT}:{_TE_RECIPE_SUPPORT}:178-185", f"{_TE_BEFORE_2_9}:transformer_engine/pytorch/fp8.py:65-73"),
        confidence=0.9, rule="block-scaled-recipe-on-gpu",
        versions="'compute capability 9.0 or higher': Transformer Engine 2.9 to 2.18; 'Hopper': 2.3 to 2.8"),
)

CAPABILITY_GATE = Signature(
    id="capability-gate", symptom="hardware", patterns=(),
    cause="A library refused a feature on the run's platform ('... is not supported on ROCm / 12.0+ architectures', "
          "'... requires Hopper', '... is only supported on sm_90a'): the GPU architecture or the software stack is "
          "outside what the feature supports; no configuration value makes it run there.",
    fix="turn the feature off on this platform (the setting or recipe that enables it) or run it on one it supports",
    source="installed:mbridge_ep_overlap/diagnose/capability_gates.py (the library's own words)", emitted=(),
    confidence=0.6, found_by="capability-gate",
    versions="any library's 'not supported on' / 'requires' / 'only supported on' line naming a GPU architecture, a "
             "compute capability, an sm_NN target or ROCm")

SIGNATURES += (CAPABILITY_GATE,)

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
