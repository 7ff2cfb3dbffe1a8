"""Crash: what the CUDA runtime, an ATen kernel's device-side assert, cuBLAS and NCCL report when a kernel or a
library call fails. ``diagnose.runtime_errors`` reads the formats and raises these rows; the tables below say
which enum, status or result each row is for.

The text is the libraries' own: ATen's ``CUDA_KERNEL_ASSERT`` (``FILE:LINE: KERNEL: block: [x,y,z], thread:
[x,y,z] Assertion `COND` failed.``), torch's ``CUDA error: MESSAGE`` with ``Search for `cudaErrorXxx'`` (the
message is ``cudaGetErrorString``, the name ``cudaGetErrorName`` of ``libcudart``), torch's cuBLAS check
``CUDA error: CUBLAS_STATUS_XXX when calling `FN(...)` `` (``libtorch_cuda``), torch's ``NCCL error: MESSAGE,
NCCL version X`` with ``ncclXxx: DESCRIPTION`` and ``Last error:`` (``ncclGetErrorString`` and torch's detail
strings), and NCCL's ``NCCL WARN`` lines (sockets, ``Cuda failure``, an InfiniBand work completion's
``ibv_wc_status``). The emitted lines were triggered on a GPU (``tests/unit/fixtures/recorded_texts``) or are
rendered from the installed libraries' strings; ``test_diagnose_runtime_errors`` checks both. A row is *generic*
(symptom only) where the error names a class and not its cause: an out-of-bounds access in some kernel, a kernel that
failed, a CUDA call inside NCCL or cuBLAS that failed, a work request flushed after an earlier error.
"""

from __future__ import annotations

from .base import Signature

CHECKED = "recorded on a GPU or rendered from the installed library's strings; test_diagnose_runtime_errors"
"""Said in ``source``: the parity of these rows' text is checked in ``test_diagnose_runtime_errors``."""
RDMA_CORE_AT = "linux-rdma/rdma-core@691953d8d502f54088f776c5ba2aeed0a5ac945d"
IBV_WC_STATUS_AT = f"{RDMA_CORE_AT}:libibverbs/verbs.h:489-514"
"""``enum ibv_wc_status`` in rdma-core (values from 0 in order), kept as an excerpt with the tests."""

_ATEN = f"installed:torch/lib/libtorch_cuda.so (ATen's CUDA_KERNEL_ASSERT; {CHECKED})"
_CUDART = f"installed:nvidia/cu13/lib/libcudart.so.13 (cudaGetErrorString / cudaGetErrorName; {CHECKED})"
_CUBLAS = f"installed:torch/lib/libtorch_cuda.so (torch's cuBLAS check; statuses of cublas_api.h; {CHECKED})"
_NCCL = f"installed:nvidia/nccl/lib/libnccl.so.2 (ncclGetErrorString, NCCL WARN; torch's NCCL error text; {CHECKED})"
_ASYNC = ("the Python frame shown after it may not be where it failed (CUDA reports a kernel's error at a later call, "
          "torch's own warning says so): rerun with CUDA_LAUNCH_BLOCKING=1 so the failing launch raises at its call")
_TORCH_ASSERT_TAIL = ("torch.AcceleratorError: CUDA error: device-side assert triggered",
                      "Search for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES"
                      ".html for more information.")
_ILLEGAL = ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
            "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES"
            ".html for more information.")


def _row(id: str, cause: str, fix: str, emitted: tuple[str, ...], confidence: float, source: str, *,
         symptom: str = "crash", generic: bool = False, versions: str = "all known", excerpts: tuple[str, ...] = ()):
    return Signature(id=id, symptom=symptom, patterns=(), cause=cause, fix=fix, source=source, emitted=emitted,
                     confidence=confidence, generic=generic, found_by="runtime-error", versions=versions,
                     excerpts=excerpts)


# ---- ATen device-side asserts ---------------------------------------------------------------------------------------
SIGNATURES = (
    _row("device-assert-token-id-past-vocab",
         "An embedding lookup (the traceback's frames show an embedding) asserted in ATen's index_select kernel "
         "(`srcIndex < srcSelectDimSize`): a token id is >= the vocabulary size of the embedding table - the "
         "tokenizer and the model's vocabulary disagree, or the data was tokenized with another tokenizer.",
         "check the data's largest token id against the model's padded_vocab_size (and the tokenizer's vocab_size); "
         "re-tokenize the data with the model's tokenizer, or set the vocabulary size from the tokenizer",
         ("/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1515: indexSelectSmallIndex: block: [0,0,0], thread: "
          "[0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
          '  File "/usr/local/lib/python3.12/site-packages/megatron/core/models/common/embeddings/'
          'language_model_embedding.py", line 111, in forward',
          "    word_embeddings = self.word_embeddings(input_ids)") + _TORCH_ASSERT_TAIL,
         0.85, _ATEN, versions="torch 2.x"),
    _row("device-assert-index-select",
         "ATen's index_select kernel asserted `srcIndex < srcSelectDimSize`: an index past the table it looks up. "
         "In training this is usually an embedding lookup (nn.Embedding / F.embedding run index_select) with a token "
         "id >= the vocabulary size; no embedding frame is in the evidence to say so.",
         "find the index_select / embedding call (" + _ASYNC + "); for an embedding, check the data's largest token "
         "id against padded_vocab_size and the tokenizer's vocab_size",
         ("/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1515: indexSelectSmallIndex: block: [0,0,0], thread: "
          "[0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",) + _TORCH_ASSERT_TAIL,
         0.7, _ATEN, versions="torch 2.x"),
    _row("device-assert-loss-target",
         "ATen's nll_loss kernel (cross_entropy) asserted `t >= 0 && t < n_classes`: a label (target) id outside the "
         "output classes - labels made with another tokenizer, or a vocab_size / output layer smaller than the "
         "tokenizer's vocabulary (or an ignore index other than the loss's).",
         "check the labels' largest id against the output size (padded_vocab_size, the tokenizer's vocab_size); "
         "re-tokenize with the model's tokenizer; padding labels must use the loss's ignore_index (-100)",
         ("/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
          "thread: [7,0,0] Assertion `t >= 0 && t < n_classes` failed.",) + _TORCH_ASSERT_TAIL,
         0.85, _ATEN, versions="torch 2.x"),
    _row("device-assert-gather-scatter-index",
         "ATen's gather / scatter kernel asserted 'scatter gather kernel index out of bounds': an index past the "
         "dimension it gathers or scatters along. In an MoE layer that is a routing index >= the number of experts or "
         "tokens (the router's top-k indices, the token permutation / unpermutation maps, a capacity or padding "
         "computation); the detail names the MoE frames when the traceback has them.",
         "print the index's max against the dimension at the gather/scatter call (" + _ASYNC + "); in MoE compare "
         "the router's top-k indices with num_moe_experts (per EP rank: the local experts) and the permutation maps "
         "with the token count",
         ("/pytorch/aten/src/ATen/native/cuda/ScatterGatherKernel.cu:163: operator(): block: [0,0,0], thread: "
          "[0,0,0] Assertion `idx_dim >= 0 && idx_dim < index_size && \"scatter gather kernel index out of bounds\"` "
          "failed.",) + _TORCH_ASSERT_TAIL,
         0.75, _ATEN, versions="torch 2.x"),
    _row("device-assert-kernel",
         "A CUDA kernel's device-side assert failed: the detail names the kernel, its file:line and the condition it "
         "requires; the values it got broke that condition.",
         "read the condition at the kernel's file:line and find the call that passed the values (" + _ASYNC + "); "
         "TORCH_USE_CUDA_DSA builds of torch say more",
         ("/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0], thread: [0,0,0] "
          "Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.",) + _TORCH_ASSERT_TAIL,
         0.5, _ATEN, versions="any CUDA kernel's assert"),
    _row("device-assert-without-kernel-line",
         "A CUDA kernel's device-side assert failed (cudaErrorAssert), but the log has no `Assertion ... failed.` "
         "line that names the kernel (the kernel's printf output went elsewhere, or was cut).",
         "rerun with CUDA_LAUNCH_BLOCKING=1 (and the kernel's stderr kept) to get the kernel's FILE:LINE and "
         "condition; " + _ASYNC,
         _TORCH_ASSERT_TAIL, 0.4, _CUDART, generic=True),
)

# ---- CUDA runtime errors --------------------------------------------------------------------------------------------
SIGNATURES += (
    _row("cuda-illegal-address",
         "A kernel accessed memory out of bounds (cudaErrorIllegalAddress, 'an illegal memory access was "
         "encountered'): the error is asynchronous, so the frame where it surfaced is not the kernel that did it; "
         "the CUDA context is unusable afterwards. With DeepEP / HybridEP frames in the log, the dispatcher's "
         "buffers (sized for fewer tokens, hidden size or ranks than this run sends) are the first suspect.",
         "rerun with CUDA_LAUNCH_BLOCKING=1 to raise at the failing launch, or under `compute-sanitizer --tool "
         "memcheck` to name the kernel and address; with DeepEP / HybridEP, check the buffer sizes (num_max_tokens, "
         "hidden) against the run's tokens per rank and compare with the alltoall dispatcher",
         _ILLEGAL, 0.6, _CUDART, generic=True),
    _row("cuda-misaligned-address",
         "A kernel accessed memory at an address not aligned for its access width (cudaErrorMisalignedAddress): a "
         "tensor view with an odd offset or stride passed to a kernel that uses vector loads (FP8 / TMA GEMMs, fused "
         "kernels want 16-byte alignment).",
         "make the tensors contiguous (and their sizes multiples of 16 bytes) before the call; CUDA_LAUNCH_BLOCKING=1 "
         "or compute-sanitizer names the kernel",
         ("torch.AcceleratorError: CUDA error: misaligned address",), 0.55, _CUDART, generic=True),
    _row("cuda-launch-failure",
         "A kernel failed while it ran (cudaErrorLaunchFailure, 'unspecified launch failure'): an exception in a kernel "
         "the hardware does not name (often an out-of-bounds access, a stack overflow, or a kernel killed by an Xid).",
         "rerun under compute-sanitizer or with CUDA_LAUNCH_BLOCKING=1; read `dmesg` / nvidia-smi -q for an Xid on "
         "that GPU",
         ("RuntimeError: CUDA error: unspecified launch failure",), 0.5, _CUDART, generic=True),
    _row("cuda-illegal-instruction",
         "A kernel executed an illegal instruction (cudaErrorIllegalInstruction): a kernel built for another "
         "architecture variant (sm_90a code on another GPU), a corrupt JIT cache, or a trap in device code.",
         "rebuild the extension for this GPU (TORCH_CUDA_ARCH_LIST), clear the JIT caches (~/.triton, "
         "~/.cache/torch_extensions); compute-sanitizer names the kernel",
         ("torch.AcceleratorError: CUDA error: an illegal instruction was encountered",), 0.55, _CUDART,
         generic=True),
    _row("cuda-graph-capture-unsupported-op",
         "An operation not allowed inside a CUDA-graph capture ran while the stream was capturing "
         "(cudaErrorStreamCaptureUnsupported / cudaErrorStreamCaptureInvalidated): a host synchronisation "
         "(.item(), .cpu(), a tensor's value used in Python), a cudaMalloc or a blocking copy inside the captured "
         "region. MoE layers capture only with static shapes (no device-to-host sync for token counts).",
         "move the sync or allocation out of the captured region (warm the allocator up before capture); for MoE "
         "with CUDA graphs, capture only the static parts (cuda_graph_scope without the MoE dispatch) or use "
         "static shapes (a capacity factor with padding); the detail says whether the frames are the MoE dispatcher's",
         ("torch.AcceleratorError: CUDA error: operation not permitted when stream is capturing",
          "torch.AcceleratorError: CUDA error: operation failed due to a previous error during capture"), 0.7, _CUDART),
    _row("cuda-runtime-out-of-memory",
         "The CUDA runtime itself ran out of GPU memory (cudaErrorMemoryAllocation), not torch's caching allocator: "
         "a library's own allocation (cuBLAS / NCCL / DeepEP / NVSHMEM buffers, a CUDA context) found the GPU full.",
         "free GPU memory before the call (a smaller micro batch or buffers, PYTORCH_CUDA_ALLOC_CONF=expandable_segments"
         ":True so the cache gives memory back), and check that no other process holds the GPU (nvidia-smi)",
         ("RuntimeError: CUDA error: out of memory",), 0.6, _CUDART, symptom="oom"),
    _row("cuda-operation-not-supported",
         "The CUDA runtime refused an operation on this device or setup (cudaErrorNotSupported): a feature the "
         "GPU, driver or system does not offer (e.g. multicast / fabric memory without NVLink SHARP or IMEX, "
         "managed memory on a platform without it).",
         "find the feature the failing call uses (the frame / library) and turn it off, or run on a system that has "
         "it (driver, NVSwitch / IMEX setup)",
         ("torch.AcceleratorError: CUDA error: operation not supported",), 0.45, _CUDART, generic=True),
    _row("cuda-peer-access",
         "Peer (GPU-to-GPU) access failed (cudaErrorPeerAccess*): the two GPUs cannot map each other's memory "
         "(no P2P over this topology, P2P disabled in a VM / container, IOMMU) or the access was enabled twice / not "
         "enabled.",
         "check `nvidia-smi topo -m` and NCCL_P2P_LEVEL / NCCL_P2P_DISABLE; in VMs and containers P2P needs the "
         "GPUs passed through with ACS off",
         ("RuntimeError: CUDA error: peer access is not supported between these two devices",), 0.55, _CUDART),
    _row("cuda-hardware-error",
         "The GPU reported a hardware error (uncorrectable ECC or NVLink error, a hardware stack error): not the "
         "program's fault.",
         "drain the node and report the GPU (nvidia-smi -q -d ECC, the Xid in dmesg); rerun elsewhere",
         ("torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered",), 0.6, _CUDART, symptom="hardware"),
    _row("cuda-runtime-error",
         "A CUDA runtime call failed: the detail names the cudaError_t and its message.",
         "CUDA_LAUNCH_BLOCKING=1 makes a kernel's error raise at its own call; the enum's meaning is in the CUDA "
         "runtime API's error types",
         ("torch.AcceleratorError: CUDA error: too many resources requested for launch",), 0.3, _CUDART, generic=True),
)

CUDA_ERRORS: dict[str, tuple[int, str, str | None]] = {
    "cudaErrorAssert": (710, "device-side assert triggered", "device-assert-without-kernel-line"),
    "cudaErrorIllegalAddress": (700, "an illegal memory access was encountered", "cuda-illegal-address"),
    "cudaErrorMisalignedAddress": (716, "misaligned address", "cuda-misaligned-address"),
    "cudaErrorLaunchFailure": (719, "unspecified launch failure", "cuda-launch-failure"),
    "cudaErrorIllegalInstruction": (715, "an illegal instruction was encountered", "cuda-illegal-instruction"),
    "cudaErrorStreamCaptureUnsupported": (900, "operation not permitted when stream is capturing",
                                          "cuda-graph-capture-unsupported-op"),
    "cudaErrorStreamCaptureInvalidated": (901, "operation failed due to a previous error during capture",
                                          "cuda-graph-capture-unsupported-op"),
    "cudaErrorMemoryAllocation": (2, "out of memory", "cuda-runtime-out-of-memory"),
    "cudaErrorNotSupported": (801, "operation not supported", "cuda-operation-not-supported"),
    "cudaErrorPeerAccessUnsupported": (217, "peer access is not supported between these two devices", "cuda-peer-access"),
    "cudaErrorPeerAccessAlreadyEnabled": (704, "peer access is already enabled", "cuda-peer-access"),
    "cudaErrorPeerAccessNotEnabled": (705, "peer access has not been enabled", "cuda-peer-access"),
    "cudaErrorECCUncorrectable": (214, "uncorrectable ECC error encountered", "cuda-hardware-error"),
    "cudaErrorNvlinkUncorrectable": (220, "uncorrectable NVLink error detected during the execution", "cuda-hardware-error"),
    "cudaErrorHardwareStackError": (714, "hardware stack error", "cuda-hardware-error"),
    "cudaErrorLaunchOutOfResources": (701, "too many resources requested for launch", "cuda-runtime-error"),
    "cudaErrorInvalidValue": (1, "invalid argument", "cuda-runtime-error"),
    # named by kernels-not-built-for-this-gpu (signatures.build), whose patterns match the message
    "cudaErrorNoKernelImageForDevice": (209, "no kernel image is available for execution on the device", None),
    "cudaErrorInvalidDeviceFunction": (98, "invalid device function", None),
    "cudaErrorSymbolNotFound": (500, "named symbol not found", None),
}
"""cudaError_t name -> (value in driver_types.h, ``cudaGetErrorString``, the row that names it; None: an existing
signature's patterns name it). Any other enum is ``cuda-runtime-error``."""

# ---- cuBLAS status --------------------------------------------------------------------------------------------------
_GEMM_CALL = ("`cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, "
              "c, std::is_same_v<C_Dtype, float> ? CUDA_R_32F : CUDA_R_16BF, ldc, compute_type, "
              "CUBLAS_GEMM_DEFAULT_TENSOR_OP)`")


def _cublas(status: str, call: str = _GEMM_CALL) -> tuple[str, ...]:
    return (f"RuntimeError: CUDA error: {status} when calling {call}",)


SIGNATURES += (
    _row("cublas-not-initialized",
         "cuBLAS could not create its handle (CUBLAS_STATUS_NOT_INITIALIZED): almost always no GPU memory left for "
         "its workspace when the first GEMM of a stream ran (the caching allocator holds the rest), or an earlier "
         "CUDA error left the context broken.",
         "leave memory for the libraries (a smaller micro batch, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), "
         "and look above for an earlier CUDA error",
         _cublas("CUBLAS_STATUS_NOT_INITIALIZED", "`cublasCreate(handle)`"), 0.6, _CUBLAS, symptom="oom"),
    _row("cublas-alloc-failed",
         "cuBLAS could not allocate GPU memory (CUBLAS_STATUS_ALLOC_FAILED): the GPU was full.",
         "lower the memory the run holds (micro batch, recompute) or give the cache back "
         "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
         _cublas("CUBLAS_STATUS_ALLOC_FAILED"), 0.6, _CUBLAS, symptom="oom"),
    _row("cublas-invalid-value",
         "A cuBLAS call got an invalid argument (CUBLAS_STATUS_INVALID_VALUE): sizes, leading dimensions or "
         "strides that do not fit the matrices (a zero or negative size, lda < rows, a non-contiguous view).",
         "print the shapes and strides of the GEMM's operands at the call the detail names; make them contiguous",
         _cublas("CUBLAS_STATUS_INVALID_VALUE"), 0.55, _CUBLAS),
    _row("cublas-arch-mismatch",
         "The GEMM needs a GPU feature this GPU lacks (CUBLAS_STATUS_ARCH_MISMATCH): e.g. FP8 or a data type the "
         "architecture does not compute.",
         "use a data type this GPU supports (FP8 needs sm_89+), or run on a newer GPU",
         _cublas("CUBLAS_STATUS_ARCH_MISMATCH"), 0.6, _CUBLAS, symptom="hardware"),
    _row("cublas-execution-failed",
         "A cuBLAS kernel failed to run (CUBLAS_STATUS_EXECUTION_FAILED): often the consequence of an earlier "
         "asynchronous CUDA error (an illegal access in another kernel) or of memory exhaustion, rarely cuBLAS itself.",
         "rerun with CUDA_LAUNCH_BLOCKING=1 to find the first failing kernel; check the memory in use at that step",
         _cublas("CUBLAS_STATUS_EXECUTION_FAILED"), 0.5, _CUBLAS, generic=True),
    _row("cublas-not-supported",
         "cuBLAS does not support the requested combination of types, layouts, alignment or sizes "
         "(CUBLAS_STATUS_NOT_SUPPORTED): e.g. an FP8 GEMM whose dimensions are not multiples of 16, or a transpose / "
         "scale mode it lacks.",
         "pad the GEMM's dimensions (FP8: multiples of 16, the MoE's per-expert token counts padded: "
         "moe_router_padding_for_fp8), keep operands aligned, or run the GEMM in BF16",
         _cublas("CUBLAS_STATUS_NOT_SUPPORTED"), 0.55, _CUBLAS),
    _row("cublas-internal-error",
         "cuBLAS failed internally (CUBLAS_STATUS_INTERNAL_ERROR): usually a failed CUDA call inside it (memory, an "
         "earlier asynchronous error).",
         "look above for an earlier CUDA error; rerun with CUDA_LAUNCH_BLOCKING=1; check the memory in use",
         _cublas("CUBLAS_STATUS_INTERNAL_ERROR"), 0.45, _CUBLAS, generic=True),
    _row("cublas-error",
         "A cuBLAS call failed: the detail names the status and the call.",
         "the status's meaning is in cublas_api.h / the cuBLAS docs; CUDA_LAUNCH_BLOCKING=1 for an earlier async error",
         _cublas("CUBLAS_STATUS_MAPPING_ERROR"), 0.3, _CUBLAS, generic=True),
)

CUBLAS_STATUSES: dict[str, tuple[int, str]] = {
    "CUBLAS_STATUS_NOT_INITIALIZED": (1, "cublas-not-initialized"), "CUBLAS_STATUS_ALLOC_FAILED": (3, "cublas-alloc-failed"),
    "CUBLAS_STATUS_INVALID_VALUE": (7, "cublas-invalid-value"), "CUBLAS_STATUS_ARCH_MISMATCH": (8, "cublas-arch-mismatch"),
    "CUBLAS_STATUS_MAPPING_ERROR": (11, "cublas-error"), "CUBLAS_STATUS_EXECUTION_FAILED": (13, "cublas-execution-failed"),
    "CUBLAS_STATUS_INTERNAL_ERROR": (14, "cublas-internal-error"), "CUBLAS_STATUS_NOT_SUPPORTED": (15, "cublas-not-supported"),
    "CUBLAS_STATUS_LICENSE_ERROR": (16, "cublas-error"),
}
"""cublasStatus_t name -> (value in cublas_api.h, the row that names it)."""

# ---- NCCL -----------------------------------------------------------------------------------------------------------
_NCCL_VERSION = "NCCL version 2.28.9"
_C10D = "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3690, "
SIGNATURES += (
    _row("nccl-remote-error",
         "NCCL lost a peer (ncclRemoteError, or NCCL's socket to the peer closed): a remote process exited or the "
         "network failed. This rank's error follows from it; the rank that failed first (torchrun's Root Cause, "
         "in the detail when the log has it) holds the real cause in its own log.",
         "read the first failing rank's log (the detail names it and its exit code) and fix that failure; if no rank "
         "exited, check the network (NCCL_DEBUG=INFO, the IB / RoCE links, the node's dmesg)",
         ("[rank0]:[E1203 01:05:31.286278562 ProcessGroupNCCL.cpp:612] [Rank 0] Collective WorkNCCL(SeqNum=1, "
          "OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=60000) raised the following async "
          "exception: NCCL error: remote process exited or there was a network error, NCCL version 2.28.9",
          "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
          "Last error:",
          "socketProgress: Connection closed by remote peer localhost<34454>",
          "[2026-12-03 01:05:31] vm:642:660 [0] misc/socket.cc:72 NCCL WARN socketProgress: Connection closed by "
          "remote peer localhost<34454>"), 0.6, _NCCL, versions="NCCL 2.x; torch 2.x"),
    _row("nccl-out-of-memory",
         "NCCL could not allocate its buffers (ncclUnhandledCudaError with `Cuda failure 'out of memory'`): the GPU "
         "was full when the communicator was created or grew (a new process group, a first collective of a kind, "
         "NVLS / buffer registration); torch's caching allocator held the memory.",
         "create the process groups (and run a first collective) before the model takes the memory, leave headroom "
         "(a smaller micro batch, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), or shrink NCCL's buffers "
         "(NCCL_BUFFSIZE, NCCL_NVLS_ENABLE=0)",
         (_C10D + "unhandled cuda error (run with NCCL_DEBUG=INFO for details), " + _NCCL_VERSION,
          "ncclUnhandledCudaError: Call to CUDA function failed.", "Last error:", "Cuda failure 2 'out of memory'"),
         0.7, _NCCL, symptom="oom", versions="NCCL 2.x; torch 2.x"),
    _row("nccl-unhandled-cuda-error",
         "A CUDA call inside NCCL failed (ncclUnhandledCudaError): the detail gives NCCL's `Cuda failure` text when "
         "the log has it; often an earlier CUDA error of the process (an illegal access in a kernel) surfacing in NCCL.",
         "read `Last error:` / the NCCL WARN line (NCCL_DEBUG=WARN at least) for the CUDA error; look above for an "
         "earlier CUDA error of the rank",
         (_C10D + "unhandled cuda error (run with NCCL_DEBUG=INFO for details), " + _NCCL_VERSION,
          "ncclUnhandledCudaError: Call to CUDA function failed."), 0.55, _NCCL, generic=True,
         versions="NCCL 2.x; torch 2.x"),
    _row("nccl-system-error",
         "A system call inside NCCL failed (ncclSystemError): sockets (a firewall, the wrong interface, "
         "NCCL_SOCKET_IFNAME), shared memory (/dev/shm too small in a container), or a limit (ulimit -l / -n).",
         "read `Last error:` (NCCL_DEBUG=WARN) for the call; in containers give /dev/shm room (--shm-size / --ipc=host) "
         "and ulimit -l unlimited; set NCCL_SOCKET_IFNAME to the interface the ranks reach each other on",
         (_C10D + "unhandled system error (run with NCCL_DEBUG=INFO for details), " + _NCCL_VERSION,
          "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. "),
         0.55, _NCCL, versions="NCCL 2.x; torch 2.x"),
    _row("nccl-internal-error",
         "NCCL's own check failed (ncclInternalError): often a mismatch between ranks (different NCCL builds, "
         "different collective arguments) or a bug in NCCL.",
         "check that every rank runs the same NCCL (NCCL_DEBUG=INFO prints it); read `Last error:`; report to NCCL",
         (_C10D + "internal error - please report this issue to the NCCL developers, " + _NCCL_VERSION,
          "ncclInternalError: Internal check failed."), 0.5, _NCCL, generic=True,
         versions="NCCL 2.x; torch 2.x"),
    _row("nccl-invalid-usage",
         "NCCL was used in a way it does not allow (ncclInvalidUsage): e.g. two ranks on the same GPU in one "
         "communicator (a wrong LOCAL_RANK -> device mapping), a communicator used after abort, mismatched groups.",
         "read `Last error:` (NCCL_DEBUG=WARN); check that each rank calls torch.cuda.set_device(LOCAL_RANK) before "
         "the process group starts, and that the ranks' groups agree",
         (_C10D + "invalid usage (run with NCCL_DEBUG=WARN for details), " + _NCCL_VERSION,
          "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."), 0.55, _NCCL,
         versions="NCCL 2.x; torch 2.x"),
    _row("nccl-invalid-argument",
         "An NCCL call got an invalid argument (ncclInvalidArgument): a null or foreign-device buffer, a count or "
         "type NCCL does not take, a rank out of range.",
         "read `Last error:` (NCCL_DEBUG=WARN) for the argument; check the tensors' devices and dtypes at the "
         "collective",
         (_C10D + "invalid argument (run with NCCL_DEBUG=WARN for details), " + _NCCL_VERSION,
          "ncclInvalidArgument: Invalid value for an argument."), 0.5, _NCCL, versions="NCCL 2.x; torch 2.x"),
)

NCCL_RESULTS: dict[str, tuple[int, str, str]] = {
    "ncclUnhandledCudaError": (1, "unhandled cuda error (run with NCCL_DEBUG=INFO for details)", "nccl-unhandled-cuda-error"),
    "ncclSystemError": (2, "unhandled system error (run with NCCL_DEBUG=INFO for details)", "nccl-system-error"),
    "ncclInternalError": (3, "internal error - please report this issue to the NCCL developers", "nccl-internal-error"),
    "ncclInvalidArgument": (4, "invalid argument (run with NCCL_DEBUG=WARN for details)", "nccl-invalid-argument"),
    "ncclInvalidUsage": (5, "invalid usage (run with NCCL_DEBUG=WARN for details)", "nccl-invalid-usage"),
    "ncclRemoteError": (6, "remote process exited or there was a network error", "nccl-remote-error"),
}
"""ncclResult_t name -> (value in nccl.h, ``ncclGetErrorString``, the row that names it)."""

# ---- NCCL's InfiniBand work completions -----------------------------------------------------------------------------
_IB = ("[2026-12-03 01:05:31] node2:642:660 [0] transport/net_ib.cc:2312 NCCL WARN NET/IB: Got completion from peer "
       "10.0.0.3<59174> with status={name}({code}) opcode=IBV_WC_RDMA_WRITE(1) vendor_err=129  hca mlx5_0")
_IB_OLD = ("[2026-12-03 01:05:31] node2:642:660 [0] transport/net_ib.cc:2312 NCCL WARN NET/IB/GIN: Got completion from "
           "peer 10.0.0.3<59174> with status={code} opcode=1 len=0 vendor err 129 (Write) hca mlx5_0")
_IB_EXCERPTS = (IBV_WC_STATUS_AT,)
SIGNATURES += (
    _row("nccl-ib-retry-exceeded",
         "An InfiniBand / RoCE send to a peer gave up after its transport retries (IBV_WC_RETRY_EXC_ERR, 12): the "
         "link went down or flaps, the fabric path is wrong (RoCE: a wrong GID index / traffic class, no lossless "
         "config), or the peer process died and its queue pair is gone.",
         "check the links of both hosts (ibstat, the switch logs), NCCL_IB_GID_INDEX for RoCE (show_gids), and whether "
         "the peer rank died first (its log); NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT raise the patience",
         (_IB.format(name="IBV_WC_RETRY_EXC_ERR", code=12), _IB_OLD.format(code=12)), 0.65, _NCCL,
         excerpts=_IB_EXCERPTS),
    _row("nccl-ib-rnr-retry-exceeded",
         "The peer was not ready to receive and the receiver-not-ready retries ran out (IBV_WC_RNR_RETRY_EXC_ERR, 13): "
         "the peer is stalled or gone.",
         "check whether the peer rank hung or died first (its log, its stacks); then the fabric",
         (_IB.format(name="IBV_WC_RNR_RETRY_EXC_ERR", code=13),), 0.6, _NCCL, excerpts=_IB_EXCERPTS),
    _row("nccl-ib-flushed",
         "An InfiniBand work request was flushed (IBV_WC_WR_FLUSH_ERR, 5): the queue pair was already in error, so "
         "this follows from an earlier error on the same connection (the first completion error, or a peer that died).",
         "look for the first completion error (another status) or the first rank to fail; this one is a consequence",
         (_IB.format(name="IBV_WC_WR_FLUSH_ERR", code=5),), 0.4, _NCCL, generic=True, excerpts=_IB_EXCERPTS),
    _row("nccl-ib-local-protection",
         "The NIC could not access local memory it was given (IBV_WC_LOC_PROT_ERR, 4): the memory registration is "
         "not valid for it - with GPU buffers, GPUDirect RDMA is not working (nvidia-peermem not loaded, dma-buf not "
         "supported by the kernel / driver, or the registration was freed).",
         "check GPUDirect RDMA: `lsmod | grep nvidia_peermem` (or NCCL_DMABUF_ENABLE=1 with a dma-buf capable kernel), "
         "NCCL_DEBUG=INFO's 'GPU Direct RDMA' lines; NCCL_NET_GDR_LEVEL=0 confirms it by going through host memory",
         (_IB.format(name="IBV_WC_LOC_PROT_ERR", code=4),), 0.6, _NCCL, excerpts=_IB_EXCERPTS),
    _row("nccl-ib-remote-access",
         "The peer's NIC refused the access (IBV_WC_REM_ACCESS_ERR, 10): the remote memory key or region is not valid "
         "(the peer freed or re-registered the buffer, or its GPUDirect registration failed).",
         "check GPUDirect RDMA on the peer host (nvidia-peermem / dma-buf) and whether the peer rank restarted or died",
         (_IB.format(name="IBV_WC_REM_ACCESS_ERR", code=10),), 0.55, _NCCL, excerpts=_IB_EXCERPTS),
    _row("nccl-ib-remote-operation",
         "The peer's NIC could not complete the operation (IBV_WC_REM_OP_ERR, 11): an error on the responder side "
         "(its queue pair in error, its memory registration).",
         "read the peer host's NCCL WARN lines and its log; check its GPUDirect RDMA setup",
         (_IB.format(name="IBV_WC_REM_OP_ERR", code=11),), 0.5, _NCCL, excerpts=_IB_EXCERPTS),
    _row("nccl-ib-completion-error",
         "An InfiniBand work completion failed: the detail names the ibv_wc_status.",
         "the status's meaning is in rdma-core's ibv_wc_status_str; check the links, the peer, and GPUDirect RDMA",
         (_IB.format(name="IBV_WC_LOC_LEN_ERR", code=1),), 0.35, _NCCL, generic=True, excerpts=_IB_EXCERPTS),
)

IBV_WC_STATUS: dict[str, tuple[int, str]] = {
    "IBV_WC_LOC_PROT_ERR": (4, "nccl-ib-local-protection"), "IBV_WC_WR_FLUSH_ERR": (5, "nccl-ib-flushed"),
    "IBV_WC_REM_ACCESS_ERR": (10, "nccl-ib-remote-access"), "IBV_WC_REM_OP_ERR": (11, "nccl-ib-remote-operation"),
    "IBV_WC_RETRY_EXC_ERR": (12, "nccl-ib-retry-exceeded"), "IBV_WC_RNR_RETRY_EXC_ERR": (13, "nccl-ib-rnr-retry-exceeded"),
}
"""ibv_wc_status name -> (value in rdma-core's verbs.h, the row that names it); any other is nccl-ib-completion-error."""
IBV_WC_NAMES = ("IBV_WC_SUCCESS", "IBV_WC_LOC_LEN_ERR", "IBV_WC_LOC_QP_OP_ERR", "IBV_WC_LOC_EEC_OP_ERR",
                "IBV_WC_LOC_PROT_ERR", "IBV_WC_WR_FLUSH_ERR", "IBV_WC_MW_BIND_ERR", "IBV_WC_BAD_RESP_ERR",
                "IBV_WC_LOC_ACCESS_ERR", "IBV_WC_REM_INV_REQ_ERR", "IBV_WC_REM_ACCESS_ERR", "IBV_WC_REM_OP_ERR",
                "IBV_WC_RETRY_EXC_ERR", "IBV_WC_RNR_RETRY_EXC_ERR", "IBV_WC_LOC_RDD_VIOL_ERR", "IBV_WC_REM_INV_RD_REQ_ERR",
                "IBV_WC_REM_ABORT_ERR", "IBV_WC_INV_EECN_ERR", "IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR",
                "IBV_WC_RESP_TIMEOUT_ERR", "IBV_WC_GENERAL_ERR", "IBV_WC_TM_ERR", "IBV_WC_TM_RNDV_INCOMPLETE")
"""Every ``enum ibv_wc_status`` value in order (its number is the index): the older NCCL format prints only the number."""
