"""Out of memory: a rank's CUDA caching allocator could not allocate. Its message (c10's
``CUDACachingAllocator``) says how much was asked, what was free and how much PyTorch holds reserved but
unallocated; ``diagnose.memory`` reads those numbers for the finding's detail."""

from __future__ import annotations

from .base import Signature
from .build import ASSEMBLED

OOM_PIECES = ("CUDA out of memory. Tried to allocate ", " has a total capacity of ", " of which ",
              "Including non-PyTorch memory, this process", "Of the allocated memory ", " is allocated by PyTorch, ",
              " is reserved by PyTorch but unallocated.", " If reserved but unallocated memory is large try setting")
"""The fixed pieces of the allocator's message, each in the installed ``torch/lib/libc10_cuda.so``."""

SIGNATURES = (
    Signature(
        id="cuda-out-of-memory", symptom="oom",
        patterns=(r"CUDA out of memory\. Tried to allocate",),
        cause="A rank ran out of GPU memory. With EP overlap on, the combined 1F1B schedule runs one microbatch's "
              "forward alongside another's backward, so more activations (and the dispatchers' buffers) are alive "
              "at once than without it; the detail says whether the memory was used or fragmented.",
        fix="`mbridge-ep-overlap plan` predicts the per-rank memory of the configuration: lower the micro-batch "
            "size, recompute more (activation recompute of the MoE layer's parts), or raise EP / PP to spread the "
            "experts; when PyTorch holds much reserved but unallocated memory, "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True first (the allocator's own advice)",
        source=f"installed:torch/lib/libc10_cuda.so (the allocator's message, {ASSEMBLED}: OOM_PIECES)",
        emitted=("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                 "of 139.80 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 138.73 GiB "
                 "memory in use. Of the allocated memory 120.50 GiB is allocated by PyTorch, and 16.20 GiB is reserved "
                 "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",),
        confidence=0.9, versions="torch 2.x"),
)

SIGNATURES += (
    Signature(
        id="cuda-driver-out-of-memory", symptom="oom",
        patterns=(r"CUresult error: 2 \(out of memory\)", r"CUDA_ERROR_OUT_OF_MEMORY"),
        cause="The CUDA driver itself could not allocate GPU memory (CUresult 2, CUDA_ERROR_OUT_OF_MEMORY): a "
              "cuMemCreate / cuMemAlloc outside PyTorch's caching allocator - a memory saver re-mapping released "
              "memory, a dispatcher's or NCCL's buffers, a CUDA-graph pool - found the GPU full. In a colocated "
              "training + inference setup the other engine's static reservation is the usual holder.",
        fix="leave the allocation room: lower what else holds the GPU (an inference engine's static memory fraction, "
            "DeepEP / HybridEP buffer sizes, NCCL buffers), or the training's own use (`mbridge-ep-overlap plan` "
            "predicts it); nvidia-smi at the failure shows who holds the memory",
        source="installed:nvidia/cu13/include/cuda.h (CUresult CUDA_ERROR_OUT_OF_MEMORY = 2)",
        emitted=("[torch_memory_saver.cpp] CUresult error: 2 (out of memory) file=csrc/utils.h func=cu_mem_create "
                 "line=187",),
        confidence=0.8, versions="any CUDA driver API caller that prints the CUresult"),
)

SIGNATURES += (
    Signature(
        id="cpu-out-of-memory", symptom="oom",
        patterns=(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate \d+ bytes",),
        cause="A rank ran out of host memory (torch's CPU allocator was refused by the OS): a host-side buffer too "
              "large for the node (checkpoint loading or conversion on the CPU, pinned staging buffers, the data "
              "loader's workers, several ranks per node each holding a full copy), or a size computed wrong (the "
              "bytes it tried are in the line: a size far beyond any node is a wrong shape, not a small node).",
        fix="compare the bytes in the line with the node's free memory (`free -g` per rank on the node): load "
            "checkpoints sharded (dist-checkpointing) or on the GPU, fewer data-loader workers, fewer ranks per node "
            "on the CPU path; a size of petabytes is a shape bug upstream of the allocation",
        source="installed:torch/lib/libc10.so",
        emitted=("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                 "memory: you tried to allocate 4611686018427387904 bytes. Error code 12 (Cannot allocate memory)",),
        confidence=0.85, versions="torch 2.x"),
)

