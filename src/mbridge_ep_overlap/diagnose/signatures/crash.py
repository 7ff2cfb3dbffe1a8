"""Crash signal: a rank died of a signal. faulthandler (on in every run this library launches) prints
the Python stack; torchrun's failure summary gives the exit code of the others."""

from __future__ import annotations

from .base import Signature

_FIX = ("read the crashing rank's stack (the innermost frame names the kernel or extension); rerun that "
        "configuration with overlap off to see whether the crash needs it; report upstream with the stack")

SIGNATURES = (
    Signature(
        id="segmentation-fault", symptom="crash",
        patterns=(r"Fatal Python error: Segmentation fault", r"Signal 11 \(SIGSEGV\) received by PID",
                  r"exitcode\s*:\s*-11\b"),
        cause="A rank died of SIGSEGV (a native extension or kernel launcher touched invalid memory).",
        fix=_FIX, source="installed:python3.12 (faulthandler)",
        emitted=("Fatal Python error: Segmentation fault",), confidence=0.4, generic=True, found_by="crash"),
    Signature(
        id="abort-signal", symptom="crash",
        patterns=(r"Fatal Python error: Aborted", r"Signal 6 \(SIGABRT\) received by PID",
                  r"exitcode\s*:\s*-6\b"),
        cause="A rank died of SIGABRT (a C++ exception or a watchdog that tears the process down).",
        fix=_FIX, source="installed:python3.12 (faulthandler)",
        emitted=("Fatal Python error: Aborted",), confidence=0.3, generic=True, found_by="crash"),
)

SIGNATURES += (
    Signature(
        id="hybridep-null-output-tokens", symptom="crash",
        patterns=(r"Assertion `args\.output_tokens_ptr != nullptr' failed",),
        cause="A HybridEP kernel asserts on a null output-token pointer (seen with NVFP4 pretraining): a bug in "
              "DeepEP's HybridEP path, fixed by DeepEP PR #625.",
        fix="use a DeepEP build that includes deepseek-ai/DeepEP PR #625 (a later container)",
        source="https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/3599",
        emitted=("Assertion `args.output_tokens_ptr != nullptr' failed",),
        corpus_report="megatron-bridge-3599", confidence=0.9, versions="DeepEP hybrid-ep before PR #625"),
    Signature(
        id="native-segfault-signal", symptom="crash",
        patterns=(r"Caught signal 11 \(Segmentation fault",),
        cause="A rank died of SIGSEGV in native code (UCX / NVSHMEM report 'Caught signal 11').",
        fix=_FIX, source="https://github.com/deepseek-ai/DeepEP/issues/126",
        emitted=("[TENCENT64:5489 :0:5489] Caught signal 11 (Segmentation fault: address not mapped to object at "
                 "address 0xfeffffff95)",),
        corpus_report="deepep-126", confidence=0.4, generic=True),
)

SIGNATURES += (
    Signature(
        id="zero-tokens-reshape", symptom="crash",
        patterns=(r"shape '\[[-0-9, ]+\]' is invalid for input of size 0\b",
                  r"cannot reshape tensor of 0 elements into shape",),
        cause="A reshape/view of a zero-element tensor: with expert parallelism a rank (or one of its local "
              "experts) can receive zero tokens in a step, and a dispatch/permute/combine path that views the "
              "empty tensor to a fixed shape (the hidden shape, or a -1 dimension) fails.",
        fix="read the failing frame: if it is MCore's token dispatcher / permute, upgrade to a megatron-core with "
            "zero-token handling there, or avoid ranks without tokens (a larger micro batch x sequence length, "
            "moe_expert_capacity_factor with padding, a load-balancing loss); report upstream with the shapes",
        source="installed:torch/lib/libtorch_cpu.so",
        emitted=("RuntimeError: shape '[2048, 1, 4096]' is invalid for input of size 0",
                 "RuntimeError: cannot reshape tensor of 0 elements into shape [-1, 0] because the unspecified "
                 "dimension size -1 can be any value and is ambiguous"),
        confidence=0.7, versions="torch 2.x"),
)
