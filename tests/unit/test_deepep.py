"""DeepEP as this library sees it: the dispatcher verdict on a build without NVSHMEM, the flex
buffer evidence, and HybridEP's run-time nvcc. DeepEP is built beside this repository (README,
section DeepEP); what is checked here runs on CPU."""

from __future__ import annotations

from dataclasses import replace

from mbridge_ep_overlap.core.dispatcher import problems
from mbridge_ep_overlap.target.cluster import describe


def test_deepep_without_nvshmem_is_not_usable_but_hybridep_is():
    # Seen on 2x H200: MCore 0.19's get_buffer() calls get_rdma_buffer_size_hint even at EP=2, and a
    # DeepEP built without NVSHMEM asserts there; HybridEP in the same build ran.
    env = replace(describe("h200", 2, deep_ep_version="1.2.1"), deep_ep_nvshmem=False, hybrid_ep_available=True)
    why = " ".join(problems("deepep", env))
    assert "without NVSHMEM" in why and "NVSHMEM_DIR" in why
    assert problems("hybridep", env) == []
    assert problems("deepep", replace(env, deep_ep_nvshmem=True)) == []


def test_flex_buffer_evidence_reads_the_globals_megatron_core_really_has():
    """The functional suite proves DeepEP/HybridEP moved the tokens by reading MCore's buffer
    globals; if a megatron-core update renamed them, this evidence would silently read False."""
    from megatron.core.transformer.moe import fused_a2a

    from mbridge_ep_overlap.lab.evidence import flex_buffers

    assert hasattr(fused_a2a, "_buffer") and hasattr(fused_a2a, "_hybrid_ep_buffer")
    assert flex_buffers() == {"deepep": False, "hybridep": False}


def test_hybridep_needs_nvcc_under_cuda_home_on_the_gpu_node(proxy_cfg, tmp_path):
    from mbridge_ep_overlap import check_ep_overlap, enable_ep_overlap

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("#!/bin/sh\n")
    on_node = replace(describe("h200", 2, deep_ep_version="1.2.1"), source="probed", hybrid_ep_available=True)
    with_toolkit = replace(on_node, env_vars={"CUDA_HOME": str(tmp_path)})
    enable_ep_overlap(proxy_cfg, "hybridep", resolve="auto", environment=with_toolkit)
    ids = lambda env: {v.rule_id for v in check_ep_overlap(proxy_cfg, environment=env)}  # noqa: E731
    assert "hybridep-jit-nvcc" not in ids(with_toolkit)
    assert "hybridep-jit-nvcc" in ids(replace(on_node, env_vars={"CUDA_HOME": str(tmp_path / "missing")}))
    # Planning for another machine cannot know its toolkit: not checked there.
    assert "hybridep-jit-nvcc" not in ids(describe("h200", 2, deep_ep_version="1.2.1"))
