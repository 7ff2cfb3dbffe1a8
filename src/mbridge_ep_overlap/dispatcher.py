"""Choosing and applying the token dispatcher for EP overlap.

Contract
--------
* ``DISPATCHERS`` are the user-facing names: ``alltoall``, ``deepep``, ``hybridep`` and ``auto``.
* ``choose(dispatcher, env, ep)`` turns ``auto`` into a concrete choice and says why, from the
  GPU architecture, the EP size and what is importable (the dispatcher-selection guidance of the
  Megatron-Bridge skills: DeepEP on Ampere/Hopper/B200 when installed and EP is large enough to
  pay, HybridEP on GB200-class NVLink domains, alltoall otherwise and for bring-up).
* ``apply_flex(model, backend, env)`` calls Megatron-Bridge's own ``apply_flex_dispatcher_backend``
  (with the described GPU when planning for another machine) and reports whether MB silently fell
  back to alltoall, so the caller can refuse or record it. It never imitates MB's allow-list.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import environment as environment_mod
from .environment import ClusterEnvironment
from .errors import UsageError

DISPATCHERS = ("alltoall", "deepep", "hybridep", "auto")
FLEX_BACKENDS = ("deepep", "hybridep")

# Below this EP size DeepEP was measured slower than alltoall (Megatron-LM issue #1456).
DEEPEP_MIN_EP = 16


@dataclass(frozen=True)
class Choice:
    dispatcher: str
    reason: str


def backend_supports_gpu(backend: str, gpu_name: str | None, major: int) -> bool:
    """Megatron-Bridge 0.6.2's allow-lists (apply/validate_flex_dispatcher_backend), as data."""
    if backend == "deepep":
        return major in (8, 9) or (gpu_name or "").startswith(("NVIDIA B200", "NVIDIA B300"))
    if backend == "hybridep":
        return major in (8, 9, 10)
    if backend == "ncclep":
        return major in (9, 10)
    return True


def usable_here(dispatcher: str, env: ClusterEnvironment) -> tuple[bool, str]:
    """Doctor's verdict: can ``dispatcher`` run EP overlap on ``env``, and why (not)."""
    if not env.has_gpu:
        return False, "no CUDA GPU visible"
    if dispatcher == "alltoall":
        return True, "NCCL all-to-all, every GPU"
    if not backend_supports_gpu(dispatcher, env.gpu_name, env.compute_capability[0]):
        return False, f"{env.gpu_name} is outside the {dispatcher} GPU allow-list (MB would fall back to alltoall)"
    if not env.deep_ep_version:
        return False, "deep_ep is not importable (not built here yet: README, section DeepEP)"
    if dispatcher == "hybridep" and not env.hybrid_ep_available:
        return False, f"deep_ep {env.deep_ep_version} has no HybridEPBuffer (build DeepEP's hybrid-ep branch)"
    if dispatcher == "deepep" and env.deep_ep_nvshmem is False:
        return False, (f"deep_ep {env.deep_ep_version} was built without NVSHMEM: Megatron-Core 0.19's DeepEP buffer "
                       "sizing fails on it at any EP size (rebuild with DEEPEP_NVSHMEM=auto)")
    return True, f"deep_ep {env.deep_ep_version} on {env.gpu_name}"


def validate_name(dispatcher: str) -> str:
    if dispatcher not in DISPATCHERS:
        raise UsageError("dispatcher", dispatcher, DISPATCHERS)
    return dispatcher


def choose(dispatcher: str, env: ClusterEnvironment, ep: int) -> Choice:
    validate_name(dispatcher)
    if dispatcher != "auto":
        return Choice(dispatcher, "requested")
    if not env.has_gpu:
        return Choice("alltoall", "auto: GPU unknown, alltoall is the dispatcher every GPU supports")
    major = env.compute_capability[0]
    name = env.gpu_name or ""
    deep_ep = env.deep_ep_version
    if major == 10 and "GB" in name.upper():
        if env.hybrid_ep_available:
            return Choice("hybridep", f"auto: {name} NVLink domain of {env.nvlink_domain_size}, HybridEP importable")
        return Choice("alltoall", f"auto: {name} would use HybridEP, but it is {_availability(deep_ep)}")
    if major in (8, 9) or name.startswith(("NVIDIA B200", "NVIDIA B300")):
        if ep < DEEPEP_MIN_EP:
            return Choice("alltoall", f"auto: EP={ep} < {DEEPEP_MIN_EP}: alltoall is as fast as DeepEP at small EP")
        if deep_ep:
            return Choice("deepep", f"auto: {name}, EP={ep}, DeepEP {deep_ep} importable")
        return Choice("alltoall", f"auto: {name} EP={ep} would use DeepEP, but it is {_availability(deep_ep)}")
    return Choice("alltoall", f"auto: {name} (sm{major}x) is outside the DeepEP/HybridEP allow-lists")


def _availability(version: str | None) -> str:
    return "not known to be installed on the target" if version is None else "not installed"


def apply_flex(model_config, backend: str, env: ClusterEnvironment) -> bool:
    """Call MB's ``apply_flex_dispatcher_backend``; return True when flex really got set."""
    from megatron.bridge.training.flex_dispatcher_backend import apply_flex_dispatcher_backend

    if env.source == "probed":
        apply_flex_dispatcher_backend(model_config, backend)
    else:
        with environment_mod.simulate(env):
            apply_flex_dispatcher_backend(model_config, backend)
    return (
        model_config.moe_token_dispatcher_type == "flex"
        and model_config.moe_flex_dispatcher_backend == backend
    )
