"""diagnose.capability_gates: a feature a library refuses on the run's platform, in its own words."""

from __future__ import annotations

import io

import pytest

from mbridge_ep_overlap.diagnose import capability_gates
from mbridge_ep_overlap.diagnose.engine import diagnose


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


@pytest.mark.parametrize(("line", "cause_id", "feature", "said"), [
    ("  RuntimeError: grouped gemm is not supported on ROCM", "capability-gate:rocm", "grouped gemm", "refused"),
    ("RuntimeError: FlashAttention-3 requires Hopper GPUs", "capability-gate:hopper", "FlashAttention-3", "needed"),
    ("ValueError: wgmma is only supported on sm_90a", "capability-gate:hopper", "wgmma", "needed"),
    ("[rank3]: NotImplementedError: FP4 GEMM is not supported on compute capability 9.0",
     "capability-gate:hopper", "FP4 GEMM", "refused"),
    ("RuntimeError: this kernel is not supported on sm_120", "capability-gate:cc12", "this kernel", "refused"),
])
def test_a_refused_feature_is_named_with_its_platform_and_gpus(line, cause_id, feature, said):
    d = run(line + "\n")
    assert d.cause_ids[0] == cause_id
    g = capability_gates.CapabilityGates()
    g.feed(line, "-:1")
    assert (g.lines[0].feature, g.lines[0].said) == (feature, said)
    top = d.findings[0]
    assert top.signature.symptom == "hardware" and feature in top.signature.cause
    gpus = next(text for _, key, text in capability_gates.GPUS_OF if cause_id.endswith(key))
    assert gpus in top.signature.cause


def test_a_library_row_that_names_the_same_line_comes_first():
    d = run("AssertionError: MXFP8 (for all gemm layouts) is not supported on 12.0+ architectures yet.\n")
    assert d.cause_ids[0] == "te-mxfp8-not-on-compute-capability-12"
    assert not any(i.startswith("capability-gate") for i in d.cause_ids)


@pytest.mark.parametrize("line", [
    "INFO: FlashAttention is supported on Hopper",  # a statement, not an error
    "The fused kernel is not supported on Hopper, see the docs",  # no error or warning prefix
    "RuntimeError: tensor is not supported on device cpu",  # no platform of the table
])
def test_lines_that_are_not_a_platform_refusal_are_not_named(line):
    assert not any(i.startswith("capability-gate") for i in run(line + "\n").cause_ids)


@pytest.mark.parametrize("line", [
    "UserWarning: FP8 attention is not supported on Hopper with cuDNN < 9.2, using bf16 attention",
    "WARNING: cuda graph capture is not supported on ROCm; disabling",
    "RuntimeError: fused kernel is not supported on sm_80, falling back to the unfused path",
])
def test_a_warning_or_a_fallback_is_not_a_cause(line):
    assert not any(i.startswith("capability-gate") for i in run(line + "\n").cause_ids)
