"""Environment and advice: the software versions and launcher variables overlap depends on, and
measured reasons to reconsider a configuration that is valid but unlikely to gain."""

from __future__ import annotations

from .. import dispatcher
from ..errors import Severity
from .base import Family, Upstream, When, rule, version_at_least

TESTED_PAIR = ("0.19.2", "0.6.2")  # megatron-core, megatron-bridge

family = rule.family(Family.ENVIRONMENT)


@family("torch-version", When.OVERLAP, "environment.torch_version", required=">= 2.6.0",
        needs=lambda f: f.env.torch_version is not None, current=lambda f: f.env.torch_version,
        upstream=Upstream.MCORE, upstream_match="hang issue with torch version")
def torch_version(f: Facts) -> bool:
    """EP overlap hangs with torch < 2.6.0.

    Fix: upgrade PyTorch to 2.6 or newer.
    """
    return version_at_least(f.env.torch_version, "2.6.0")


@family("cuda-device-max-connections", When.OVERLAP, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS",
        severity=Severity.WARNING, required="> 1 (32 recommended)",
        current=lambda f: f.env_var("CUDA_DEVICE_MAX_CONNECTIONS"))
def cuda_device_max_connections(f: Facts) -> bool:
    """CUDA_DEVICE_MAX_CONNECTIONS=1 serialises the all-to-all stream behind compute (about half the
    gain lost).

    Fix: export CUDA_DEVICE_MAX_CONNECTIONS=32 before the process starts (a launcher value wins over
    cfg.env_vars).
    """
    return f.env_var("CUDA_DEVICE_MAX_CONNECTIONS") != "1"


@family("tested-versions", When.OVERLAP, "environment.mcore_version", severity=Severity.WARNING,
        required="megatron-core 0.19.2 with megatron-bridge 0.6.2", needs=lambda f: bool(f.env.mcore_version),
        current=lambda f: f"megatron-core {f.env.mcore_version}, megatron-bridge {f.env.mb_version}")
def tested_versions(f: Facts) -> bool:
    """these rules mirror the tested pair; other versions may check differently.

    Fix: install megatron-core==0.19.2 and megatron-bridge==0.6.2.
    """
    return (f.env.mcore_version, f.env.mb_version) == TESTED_PAIR


@family("small-ep-alltoall", When.OVERLAP, "model.expert_model_parallel_size", severity=Severity.ADVICE,
        required="EP > 4, or more than 2 nodes, or a flex dispatcher")
def small_ep_alltoall(f: Facts) -> bool:
    """with EP <= 4 over alltoall on <= 2 nodes the all-to-all is cheap; on 2x H200 NVLink overlap
    measured 0.88-1.02x of overlap off (raw MCore probe and docs/benchmarks.md), at best +2%.

    Fix: benchmark before keeping it (mbridge-ep-overlap bench); MB docs advise against overlap
    here.
    """
    return (f.dispatcher != "alltoall" or (f.model("expert_model_parallel_size") or 1) > 4
        or (f.env.num_nodes or 1) > 2)


@family("small-ep-deepep", When.OVERLAP_FLEX, "model.expert_model_parallel_size", severity=Severity.ADVICE,
        required=f"EP >= {dispatcher.DEEPEP_MIN_EP} for 'deepep' (where "
                "DeepEP pays), else dispatcher='alltoall'")
def small_ep_deepep(f: Facts) -> bool:
    """at small EP DeepEP measured slower than alltoall; on 2x H200 (EP 2, NVLink) overlap with
    DeepEP ran at 0.75-0.90x of overlap off, 9-45% of its dispatch/combine hidden.

    Fix: use dispatcher='alltoall' (or 'auto') below EP 16, or benchmark it (mbridge-ep-overlap
    bench --variants off,deepep).
    """
    return f.flex_backend != "deepep" or (f.model("expert_model_parallel_size") or 1) >= dispatcher.DEEPEP_MIN_EP


RULES = family.rules
