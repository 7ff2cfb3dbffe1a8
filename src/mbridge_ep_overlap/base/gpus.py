"""The GPUs a target can be described with: name as the device reports it, compute capability,
GPUs per node, NVLink domain size, memory and SM count. Pure data (no torch import).

Sources: GPUs per node and NVLink domain as Megatron-Bridge 0.6.2's performance scripts set them
(``scripts/performance/argument_parser.py`` NUM_GPUS_PER_NODE_MAP: 8 for H100/B200/B300, 4 for
GB200/GB300/VR200; ``utils/utils.py``: NVLINK_DOMAIN_SIZE 8, or 72 with MNNVL), compute capability
from NVIDIA's CUDA documentation (sm90, sm100, sm103); the device names are what
``torch.cuda.get_device_properties(0).name`` reports, which MB's flex allow-list matches by prefix
(B200/B300 exactly; the others only by major version).
"""

from __future__ import annotations

from dataclasses import dataclass


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


GPU_CATALOG: dict[str, GPUModel] = {
    g.key: g
    for g in (
        GPUModel("a100", "NVIDIA A100-SXM4-80GB", 8, 0, 8, 8, 80, 108),
        GPUModel("h100", "NVIDIA H100 80GB HBM3", 9, 0, 8, 8, 80, 132),
        GPUModel("h200", "NVIDIA H200", 9, 0, 8, 8, 141, 132),
        GPUModel("b200", "NVIDIA B200", 10, 0, 8, 8, 180, 148),
        GPUModel("b300", "NVIDIA B300 SXM6 AC", 10, 3, 8, 8, 268, 148),
        GPUModel("gb200", "NVIDIA GB200", 10, 0, 4, 72, 186, 152),
        GPUModel("gb300", "NVIDIA GB300", 10, 3, 4, 72, 268, 152),
        # Vera Rubin NVL72: compute capability 10.7 (sm_107) as Triton's and CUTLASS's Rubin support name
        # it - not stated by MB or MCore, which only test the major version; device name unverified.
        GPUModel("vr200", "NVIDIA VR200", 10, 7, 4, 72, 288, 160),
    )
}


def match(gpu_name: str | None) -> GPUModel | None:
    """The catalogue entry of a device name (longest key first: 'GB200' is not a 'B200')."""
    if not gpu_name:
        return None
    compact = gpu_name.upper().replace(" ", "")
    for g in sorted(GPU_CATALOG.values(), key=lambda g: -len(g.key)):
        if gpu_name.startswith(g.name) or g.key.upper() in compact:
            return g
    return None


def canonical_gpu(name):
    """A GPU kind in its canonical spelling (the ``GPU_CATALOG`` key): kinds are case-insensitive
    ('H100' is 'h100'); anything else is returned as it is, for the caller to refuse."""
    return name.lower() if isinstance(name, str) else name
