"""``cfg.env_vars`` that MB would apply after CUDA started are exported by re-executing the rank."""

from __future__ import annotations

from mbridge_ep_overlap.tools.run import REEXEC_MARK, env_too_late


def test_late_values_are_the_ones_the_launcher_did_not_export():
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": 32, "NCCL_NVLS_ENABLE": "0"}
    assert env_too_late(env, {"NCCL_NVLS_ENABLE": "1"}, cuda_initialized=True) == {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}


def test_nothing_is_late_before_cuda_starts():
    assert env_too_late({"CUDA_DEVICE_MAX_CONNECTIONS": 32}, {}, cuda_initialized=False) == {}


def test_an_exported_value_wins_as_with_mbs_setdefault():
    assert env_too_late({"CUDA_DEVICE_MAX_CONNECTIONS": 32}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, True) == {}


def test_a_reexecuted_rank_never_loops():
    assert env_too_late({"CUDA_DEVICE_MAX_CONNECTIONS": 32}, {REEXEC_MARK: "1"}, True) == {}
