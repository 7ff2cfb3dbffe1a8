"""``probe()``: the target is this machine - its GPUs, its installed stack, its launcher variables.

Contract: reads this process and machine; never initialises CUDA beyond reading device properties
and never imports DeepEP's kernels on a machine without a GPU. Unknown facts stay ``None``. The
installed-package facts (versions, DeepEP's kernels) are read once per process; the world size and
environment variables are read at each call (a launcher may set them later).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys

from ..base import gpus
from .cluster import RELEVANT_ENV_VARS, ClusterEnvironment, dist_version, installed_versions
from .deep_ep import DeepEPInfo, deep_ep_info
from .smoke_verdicts import cached_verdicts

def te_version_here() -> str:
    """Version of the Transformer Engine that imports in this process ("" when none does)."""
    from .shims import real_te_available

    if not real_te_available():
        return ""
    return dist_version("transformer-engine", "transformer_engine", "transformer-engine-torch") or "unknown"


def _te_has_nccl_ep() -> bool:
    """Whether this TE was built with NCCL EP (what MCore's 'ncclep' backend calls)."""
    if not te_version_here():
        return False
    try:
        import transformer_engine.pytorch.ep  # noqa: F401
    except Exception:  # noqa: BLE001 - a TE without NCCL EP fails in several ways: each means "not there"
        return False
    return True


def cudnn_version_text(number: int | None) -> str | None:
    """cuDNN's version number (``cudnnGetVersion``: major*10000 + minor*100 + patch since 9.0;
    major*1000 + minor*100 + patch before) as 'X.Y.Z'."""
    if not number:
        return None
    major, rest = (number // 10000, number % 10000) if number >= 90000 else (number // 1000, number % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def library_file(function) -> str | None:
    """The file a loaded ctypes function comes from (``dladdr``): a library loaded by bare name
    ('libcudnn.so', resolved through the loader's search path) named by its real file."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    try:
        dladdr = ctypes.CDLL(None).dladdr
        info = DlInfo()
        if dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    except (AttributeError, OSError, ValueError):  # no dladdr in this libc: the name ctypes was given
        pass
    return None


def _cudnn_pair() -> tuple[str | None, str | None, str | None]:
    """(the cuDNN torch runs, the cuDNN Transformer Engine loaded, that library's file); None where
    unknown. TE loads its own libcudnn with ctypes when it is imported, searching ``CUDNN_HOME``,
    ``CUDNN_PATH``, ``CUDA_HOME``, ``CUDA_PATH`` and /usr/local/cuda before the pip wheel, so it can
    load a different cuDNN from the one torch links (``rules.environment.te_cudnn_matches_torch``)."""
    if not te_version_here():
        return None, None, None
    import ctypes

    import torch

    try:
        ours = cudnn_version_text(torch.backends.cudnn.version())
    except Exception:  # noqa: BLE001 - a torch without cuDNN
        ours = None
    try:
        import transformer_engine.common as te_common

        handle = te_common._CUDNN_LIB_CTYPES
        get_version = handle.cudnnGetVersion
        get_version.restype = ctypes.c_size_t
        return ours, cudnn_version_text(int(get_version())), library_file(get_version) or str(handle._name)
    except Exception:  # noqa: BLE001 - another TE layout: unknown, never a crash
        return ours, None, None


# Read in a child process while this one has not initialised CUDA: CUDA_DEVICE_MAX_CONNECTIONS (and the
# other variables of cfg.env_vars) take effect only if set before the CUDA context exists, and MB applies
# cfg.env_vars in pretrain(), after the probe that judges them (measured on 1x H200, 2026-12-01: with the
# probe reading get_device_properties in-process, CUDA was initialised before MB applied cfg.env_vars).
_GPU_FACTS_CHILD = (
    "import json, torch\n"
    "p = torch.cuda.get_device_properties(0)\n"
    "print(json.dumps([p.name, p.major, p.minor, torch.cuda.device_count()]))\n"
)


def gpu_facts(torch) -> tuple[str | None, tuple[int, int] | None, int | None]:
    """GPU 0's name, compute capability and the visible GPU count - without initialising CUDA here.

    ``torch.cuda.is_available()`` and ``device_count()`` do not initialise CUDA; the device's properties
    would, so they come from a child process unless this process has initialised CUDA already.
    """
    if not torch.cuda.is_available():
        return None, None, None
    if torch.cuda.is_initialized():
        props = torch.cuda.get_device_properties(0)
        return props.name, (props.major, props.minor), torch.cuda.device_count()
    try:
        out = subprocess.run([sys.executable, "-c", _GPU_FACTS_CHILD], capture_output=True, text=True, timeout=120,
                             check=True).stdout.strip().splitlines()[-1]
        name, major, minor, count = json.loads(out)
        return str(name), (int(major), int(minor)), int(count)
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as e:
        raise RuntimeError(f"reading GPU 0's properties in a child process failed ({e}); "
                           "CUDA is left uninitialised here so that cfg.env_vars can still take effect") from None


@functools.lru_cache(maxsize=1)
def _static() -> dict:
    import torch

    gpu_name, cc, per_node = gpu_facts(torch)
    catalog = gpus.match(gpu_name)
    info = deep_ep_info() if cc is not None else DeepEPInfo("")
    health = None
    if cc is not None:  # the verdicts `mbridge-ep-overlap doctor --smoke` cached on this node, if any
        health = cached_verdicts()
    return {
        **installed_versions(),
        "torch_version": torch.__version__.split("+")[0],
        "gpu_name": gpu_name,
        "compute_capability": cc,
        "gpus_per_node": per_node,
        "nvlink_domain_size": catalog.nvlink_domain_size if catalog else None,
        "te_version": te_version_here(),
        "te_nccl_ep": _te_has_nccl_ep(),
        "deep_ep_version": info.version,
        "hybrid_ep_available": info.hybrid_ep,
        "deep_ep_nvshmem": info.nvshmem,
        "deep_ep_build": info.build or None,
        "dispatcher_health": health,
        "apex_fused_wgrad": importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None,
        **dict(zip(("torch_cudnn_version", "te_cudnn_version", "te_cudnn_library"), _cudnn_pair())),
    }


def probe() -> ClusterEnvironment:
    """Describe this process's machine. Unknown facts stay ``None``."""
    import torch

    world = os.environ.get("WORLD_SIZE")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
    return ClusterEnvironment(
        **_static(),
        world_size=int(world) if world and str(world).isdigit() else None,
        env_vars={k: os.environ[k] for k in RELEVANT_ENV_VARS if k in os.environ},
        source="probed",
    )
