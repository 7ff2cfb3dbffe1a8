"""The cluster a configuration will run on, as plain data: hardware and software stack.

Contract
--------
``ClusterEnvironment`` holds the GPU model and compute capability, world size, GPUs per node and
NVLink domain, the versions of torch / Transformer Engine / Megatron-Core / Megatron-Bridge, the
DeepEP build (version, HybridEP, NVSHMEM kernels) and the launcher environment variables that
matter for EP overlap. Every field may be ``None`` meaning *unknown*; rules that need an unknown
fact are reported as "not checked", never guessed. For TE and DeepEP, ``""`` means known missing.

``describe(gpu, num_gpus, ...)`` builds a target for planning on a CPU login node and refuses bad
arguments with ``UsageError``; ``probe()`` (in ``target.probe``) reads this machine. Importing this
module imports neither torch nor Megatron.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import asdict, dataclass, field
from typing import Any

from ..base.errors import UsageError
from ..base.sizes import positive_int
from ..base.gpus import GPU_CATALOG, canonical_gpu
from .stack import REFERENCE_TE_VERSION, is_version, require_possible_te

# Launcher variables EP overlap depends on (read by the doctor and by the rules).
RELEVANT_ENV_VARS = (
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
    "NVLINK_DOMAIN_SIZE",
    "USE_MNNVL",
    "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API",
    "NCCL_NVLS_ENABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NVSHMEM_DISABLE_NVLS",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "TORCH_NCCL_HIGH_PRIORITY",
    "PYTORCH_CUDA_ALLOC_CONF",
    "WORLD_SIZE",
    "CUDA_HOME",
)


@dataclass(frozen=True)
class ClusterEnvironment:
    gpu_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    world_size: int | None = None
    gpus_per_node: int | None = None
    nvlink_domain_size: int | None = None
    torch_version: str | None = None
    te_version: str | None = None  # "" = known missing, None = unknown
    mcore_version: str | None = None
    mb_version: str | None = None
    deep_ep_version: str | None = None  # "" = known missing, None = unknown
    hybrid_ep_available: bool | None = None
    deep_ep_nvshmem: bool | None = None  # built with NVSHMEM (internode kernels); None = unknown
    deep_ep_build: str | None = None  # one line on the DeepEP build: its NVSHMEM kernels (doctor)
    te_nccl_ep: bool | None = None  # TE built with NCCL EP (transformer_engine.pytorch.ep); None = unknown
    apex_fused_wgrad: bool | None = None  # APEX's fused_weight_gradient_mlp_cuda importable; None = unknown
    torch_cudnn_version: str | None = None  # the cuDNN torch runs; None = unknown
    te_cudnn_version: str | None = None  # the cuDNN Transformer Engine loaded (its own ctypes search); None = unknown
    te_cudnn_library: str | None = None  # ... and its file
    dispatcher_health: dict[str, str] | None = None  # this node's `doctor --smoke` verdicts; None = not checked
    env_vars: dict[str, str] = field(default_factory=dict)
    source: str = "probed"

    @property
    def has_gpu(self) -> bool:
        return self.compute_capability is not None

    @property
    def num_nodes(self) -> int | None:
        if self.world_size and self.gpus_per_node:
            return max(1, -(-self.world_size // self.gpus_per_node))
        return None

    @property
    def described(self) -> bool:
        return self.source != "probed"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        return d

    def summary(self) -> str:
        gpu = (f"{self.gpu_name} (sm{self.compute_capability[0]}{self.compute_capability[1]})" if self.has_gpu
               else "no GPU known")
        world = f", world size {self.world_size}" if self.world_size else ""
        te = {None: "TE unknown", "": "no TE"}.get(self.te_version, f"TE {self.te_version}")
        return f"{self.source}: {gpu}{world}, {te}"


def dist_version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def installed_versions() -> dict[str, str]:
    """The Megatron pair and torch installed here (the job runs this library's pinned pair)."""
    return {
        "mcore_version": dist_version("megatron-core", "megatron_core"),
        "mb_version": dist_version("megatron-bridge", "megatron_bridge"),
        "torch_version": dist_version("torch").split("+")[0] or None,
    }


def describe(
    gpu: Any,
    num_gpus: Any,
    *,
    env_vars: dict[str, str] | None = None,
    te_version: str | None = REFERENCE_TE_VERSION,
    deep_ep_version: str | None = None,
    torch_version: str | None = None,
) -> ClusterEnvironment:
    """A target cluster of ``num_gpus`` GPUs of kind ``gpu`` (one of ``GPU_CATALOG``).

    Library versions default to the ones installed here (the job will run this library's pinned
    pair); Transformer Engine to the reference stack MB 0.6.2 is released with
    (``stack.REFERENCE_TE_VERSION``); DeepEP is unknown unless given. ``""`` means known missing,
    ``None`` unknown.
    """
    if not isinstance(gpu, str) or canonical_gpu(gpu) not in GPU_CATALOG:
        raise UsageError("GPU", gpu, sorted(GPU_CATALOG))
    if positive_int(num_gpus) is None:
        raise UsageError("number of GPUs", num_gpus, "an integer >= 1", "invalid")
    for what, value in (("te_version", te_version), ("deep_ep_version", deep_ep_version),
                        ("torch_version", torch_version)):
        if value is not None and not (isinstance(value, str) and (value == "" or is_version(value))):
            raise UsageError(what, value, "a version string such as 2.18.0 (PEP 440, no blanks), '' for none, or None "
                             "for unknown", "invalid")
    require_possible_te(te_version, "te_version")
    if env_vars is not None and not isinstance(env_vars, dict):
        raise UsageError("env_vars", env_vars, "a dict of variable name -> value", "invalid")
    g = GPU_CATALOG[canonical_gpu(gpu)]
    versions = installed_versions()
    return ClusterEnvironment(
        gpu_name=g.name,
        compute_capability=(g.major, g.minor),
        world_size=num_gpus,
        gpus_per_node=min(g.gpus_per_node, num_gpus),
        nvlink_domain_size=g.nvlink_domain_size,
        torch_version=torch_version or versions["torch_version"],
        te_version=te_version,
        te_nccl_ep=False if te_version == "" else None,
        mcore_version=versions["mcore_version"],
        mb_version=versions["mb_version"],
        deep_ep_version=deep_ep_version,
        hybrid_ep_available=None if deep_ep_version is None else bool(deep_ep_version),
        env_vars={str(k): str(v) for k, v in (env_vars or {}).items()},
        source=f"described: {num_gpus}x {g.key}",
    )
