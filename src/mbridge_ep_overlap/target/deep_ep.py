"""What ``deep_ep`` is on this machine: its version, whether it has HybridEP, whether its
extension links NVSHMEM, and its build line. Contract: ``deep_ep_info()`` never raises (a
``deep_ep`` that does not import is version ""); it imports ``deep_ep`` only when called.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

from .cluster import dist_version


@dataclass(frozen=True)
class DeepEPInfo:
    version: str  # "" when deep_ep does not import
    hybrid_ep: bool = False
    nvshmem: bool | None = None
    build: str = ""


def _links_nvshmem(module_name: str) -> bool | None:
    """Whether a compiled extension needs libnvshmem_host (DeepEP's internode/low-latency build)."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin:
        return None
    try:
        with open(spec.origin, "rb") as f:
            return b"libnvshmem_host" in f.read()
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def deep_ep_info() -> DeepEPInfo:
    """What ``deep_ep`` is here: version, HybridEP, and whether its extension links NVSHMEM."""
    try:
        import deep_ep
    except Exception:  # noqa: BLE001 - ImportError, or OSError from a build for another CUDA
        return DeepEPInfo("")
    version = getattr(deep_ep, "__version__", "") or dist_version("deep_ep", "deep-ep") or "unknown"
    nvshmem = _links_nvshmem("deep_ep_cpp")
    build = "NVSHMEM kernels: " + ("unknown" if nvshmem is None else ("yes" if nvshmem else "no"))
    return DeepEPInfo(version, hasattr(deep_ep, "HybridEPBuffer"), nvshmem, build)
