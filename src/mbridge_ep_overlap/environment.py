"""The cluster a configuration will run on: probed from this machine, or described.

Contract
--------
``ClusterEnvironment`` is plain data: GPU model and compute capability, world size and GPUs per
node, the versions of torch / Transformer Engine / Megatron-Core / Megatron-Bridge / DeepEP, and
the launcher environment variables that matter for EP overlap. Every field may be ``None`` meaning
*unknown*; rules that need an unknown fact are reported as "not checked", never guessed.

* ``probe()`` reads this process and machine (it never initialises CUDA beyond reading device
  properties, and never imports DeepEP's kernels on a machine without a GPU).
* ``describe(gpu=..., num_gpus=...)`` builds a target cluster for planning on a CPU login node;
  package availability on the target is unknown unless stated.
* ``simulate(env)`` is the one place where hardware is faked: inside it,
  ``torch.cuda.is_available`` / ``get_device_properties`` / ``device_count`` and ``WORLD_SIZE``
  answer as the described cluster, and ``os.environ`` is restored on exit. Nothing else of
  Megatron is patched. ``current()`` returns the simulated environment inside, a probe outside.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import os
import types
from dataclasses import asdict, dataclass, field, replace
from typing import Iterator
from unittest import mock

from .errors import UsageError

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
class GPUModel:
    key: str
    name: str  # as torch.cuda.get_device_properties(0).name reports it
    major: int
    minor: int
    gpus_per_node: int
    nvlink_domain_size: int
    memory_gib: int
    multiprocessors: int


# Names as the devices report them; Megatron-Bridge's allow-lists match on major and name prefix.
GPU_CATALOG: dict[str, GPUModel] = {
    g.key: g
    for g in (
        GPUModel("a100", "NVIDIA A100-SXM4-80GB", 8, 0, 8, 8, 80, 108),
        GPUModel("h100", "NVIDIA H100 80GB HBM3", 9, 0, 8, 8, 80, 132),
        GPUModel("h200", "NVIDIA H200", 9, 0, 8, 8, 141, 132),
        GPUModel("b200", "NVIDIA B200", 10, 0, 8, 8, 180, 148),
        GPUModel("gb200", "NVIDIA GB200", 10, 0, 4, 72, 186, 152),
    )
}


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
    deep_ep_build: str | None = None  # one line: source commit, arch list, kernels (doctor)
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

    def with_env(self, **env: str) -> "ClusterEnvironment":
        return replace(self, env_vars={**self.env_vars, **{k: str(v) for k, v in env.items()}})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        return d


def dist_version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def te_version_here() -> str:
    """Version of the Transformer Engine that imports in this process ("" when none does)."""
    from .import_shims import real_te_available

    return dist_version("transformer-engine", "transformer_engine") or "unknown" if real_te_available() else ""


@dataclass(frozen=True)
class DeepEPInfo:
    version: str  # "" when deep_ep does not import
    hybrid_ep: bool = False
    nvshmem: bool | None = None
    build: str = ""


BUILD_RECORD = "ep_overlap_build.json"  # written into the wheel by scripts/gpu/build_deepep.sh


def summarize_deep_ep_build(record: dict) -> str:
    """One line from a build record: where the source came from, for which GPUs, which kernels."""
    src = record.get("source") or {}
    commit = (src.get("commit") or "")[:9]
    origin = f"{src.get('ref', '?')}@{commit}" if commit else "unknown source"
    parts = [origin, f"TORCH_CUDA_ARCH_LIST={record.get('torch_cuda_arch_list', '?')}"]
    parts.append("NVSHMEM: yes" if record.get("nvshmem") else "NVSHMEM: no")
    if record.get("kernels"):
        parts.append(f"kernels: {record['kernels']}")
    parts.append(f"HybridEP: {'yes' if record.get('hybrid_ep') else 'no'}")
    if record.get("torch"):
        parts.append(f"built for torch {record['torch']}")
    return ", ".join(parts)


def _links_nvshmem(module_name: str) -> bool | None:
    """Whether a compiled extension needs libnvshmem_host (DeepEP's internode/low-latency build)."""
    import importlib.util

    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin:
        return None
    try:
        with open(spec.origin, "rb") as f:
            return b"libnvshmem_host" in f.read()
    except OSError:
        return None


def deep_ep_info() -> DeepEPInfo:
    """What ``deep_ep`` is here: version, HybridEP, NVSHMEM kernels and the build record if any."""
    try:
        import deep_ep
    except Exception:
        return DeepEPInfo("")
    version = getattr(deep_ep, "__version__", "") or dist_version("deep_ep", "deep-ep") or "unknown"
    record = None
    try:
        import importlib.resources
        import json

        record = json.loads((importlib.resources.files("deep_ep") / BUILD_RECORD).read_text())
    except Exception:
        pass
    hybrid = hasattr(deep_ep, "HybridEPBuffer")
    nvshmem = record.get("nvshmem") if record else _links_nvshmem("deep_ep_cpp")
    if record:
        build = summarize_deep_ep_build(record)
    else:
        build = f"no build record (not built by scripts/gpu/build_deepep.sh); NVSHMEM: {_yes_no(nvshmem)}"
    return DeepEPInfo(version, hybrid, nvshmem, build)


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def probe() -> ClusterEnvironment:
    """Describe this process's machine. Unknown facts stay ``None``."""
    import torch

    gpu_name = cc = None
    per_node = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu_name, cc = props.name, (props.major, props.minor)
        per_node = torch.cuda.device_count()
    world = os.environ.get("WORLD_SIZE")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
    catalog = _catalog_match(gpu_name)
    deep_ep = deep_ep_info()
    return ClusterEnvironment(
        gpu_name=gpu_name,
        compute_capability=cc,
        world_size=int(world) if world else None,
        gpus_per_node=per_node,
        nvlink_domain_size=catalog.nvlink_domain_size if catalog else None,
        torch_version=torch.__version__.split("+")[0],
        te_version=te_version_here(),
        mcore_version=dist_version("megatron-core", "megatron_core"),
        mb_version=dist_version("megatron-bridge", "megatron_bridge"),
        deep_ep_version=deep_ep.version,
        hybrid_ep_available=deep_ep.hybrid_ep,
        deep_ep_nvshmem=deep_ep.nvshmem,
        deep_ep_build=deep_ep.build or None,
        env_vars={k: os.environ[k] for k in RELEVANT_ENV_VARS if k in os.environ},
        source="probed",
    )


def _catalog_match(gpu_name: str | None) -> GPUModel | None:
    if not gpu_name:
        return None
    for g in GPU_CATALOG.values():
        if gpu_name.startswith(g.name) or g.key.upper() in gpu_name.upper().replace(" ", ""):
            return g
    return None


def describe(
    gpu: str,
    num_gpus: int,
    *,
    env_vars: dict[str, str] | None = None,
    te_version: str | None = None,
    deep_ep_version: str | None = None,
    torch_version: str | None = None,
) -> ClusterEnvironment:
    """A target cluster of ``num_gpus`` GPUs of kind ``gpu`` (one of ``GPU_CATALOG``).

    Library versions default to the ones installed here (the job will run this library's pinned
    pair); TE and DeepEP on the target are unknown unless given ("" means known missing).
    """
    key = gpu.lower()
    if key not in GPU_CATALOG:
        raise UsageError("GPU", gpu, sorted(GPU_CATALOG))
    if not isinstance(num_gpus, int) or num_gpus < 1:
        raise UsageError("number of GPUs", num_gpus, "a positive integer")
    g = GPU_CATALOG[key]
    import torch

    return ClusterEnvironment(
        gpu_name=g.name,
        compute_capability=(g.major, g.minor),
        world_size=num_gpus,
        gpus_per_node=min(g.gpus_per_node, num_gpus),
        nvlink_domain_size=g.nvlink_domain_size,
        torch_version=torch_version or torch.__version__.split("+")[0],
        te_version=te_version,
        mcore_version=dist_version("megatron-core", "megatron_core"),
        mb_version=dist_version("megatron-bridge", "megatron_bridge"),
        deep_ep_version=deep_ep_version,
        hybrid_ep_available=None if deep_ep_version is None else bool(deep_ep_version),
        env_vars=dict(env_vars or {}),
        source=f"described: {num_gpus}x {key}",
    )


_SIMULATED: contextvars.ContextVar[ClusterEnvironment | None] = contextvars.ContextVar(
    "mbridge_ep_overlap_simulated_environment", default=None
)


def current() -> ClusterEnvironment:
    """The simulated environment inside ``simulate()``, else a fresh probe."""
    return _SIMULATED.get() or probe()


@contextlib.contextmanager
def simulate(env: ClusterEnvironment) -> Iterator[ClusterEnvironment]:
    """Fake only the hardware (and WORLD_SIZE) of ``env``; restore ``os.environ`` afterwards."""
    import torch

    saved_environ = dict(os.environ)
    token = _SIMULATED.set(env)
    patches = []
    if env.has_gpu:
        known = _catalog_match(env.gpu_name) or GPU_CATALOG["h100"]  # memory/SM count only
        props = types.SimpleNamespace(
            name=env.gpu_name,
            major=env.compute_capability[0],
            minor=env.compute_capability[1],
            total_memory=known.memory_gib << 30,
            multi_processor_count=known.multiprocessors,
        )
        patches = [
            mock.patch.object(torch.cuda, "is_available", lambda: True),
            mock.patch.object(torch.cuda, "get_device_properties", lambda *a, **k: props),
            mock.patch.object(torch.cuda, "device_count", lambda: env.gpus_per_node or 1),
        ]
    try:
        for p in patches:
            p.start()
        if env.world_size:
            os.environ["WORLD_SIZE"] = str(env.world_size)
        for k, v in env.env_vars.items():
            os.environ[k] = str(v)
        yield env
    finally:
        for p in reversed(patches):
            p.stop()
        _SIMULATED.reset(token)
        os.environ.clear()
        os.environ.update(saved_environ)
