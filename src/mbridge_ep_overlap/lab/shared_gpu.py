"""Ranks that share one GPU, each made to look alone on a node of its own: a test-hardware emulation.

Contract: ``python -m torch.distributed.run --nproc_per_node N --module mbridge_ep_overlap.lab.shared_gpu
SCRIPT ARGS...`` runs ``SCRIPT ARGS...`` as ``__main__`` in every rank after ``rank_environment``:
``LOCAL_RANK=0`` and ``LOCAL_WORLD_SIZE=1`` (Megatron-Bridge then puts every rank on GPU 0) and an
``NCCL_HOSTID`` of the rank's own, so NCCL sees N hosts of one GPU each - no "Duplicate GPU
detected" refusal - and carries every collective (the EP all-to-all included) over its network
transport, on sockets over the loopback interface (``NCCL_SOCKET_IFNAME=lo``, ``NCCL_IB_DISABLE=1``;
values the caller set win). The model, config, data, schedule and numerics are the real ones; only
the hardware is emulated.

What it is for: correctness evidence with EP > 1 on a machine with fewer GPUs than ranks - loss
parity between overlap off and on, that MCore's combined-1F1B schedule ran, delayed wgrad,
packed sequences - through ``lab.launch.launch(..., share_gpu=True)``, which the functional suite
uses when ``EP_OVERLAP_SHARE_GPU=1`` (``enabled()``). What it is not: timings (the ranks time-slice
one GPU and the "network" is TCP on loopback; bench never uses it), nor DeepEP / HybridEP, whose
buffers need one GPU per rank joined by NVLink (the suite does not launch those runs here).
"""

from __future__ import annotations

import os
import runpy
import sys

ENV = "EP_OVERLAP_SHARE_GPU"
"""``1``: the functional suite runs its EP > 1 runs with every rank on GPU 0 (this module)."""
HOSTID_PREFIX = "ep-overlap-shared-gpu-rank"
_NCCL_DEFAULTS = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}


def enabled(environ: dict | None = None) -> bool:
    return (environ if environ is not None else os.environ).get(ENV, "").strip() == "1"


def usable_gpus(nproc: int) -> int:
    """The GPUs ``nproc`` ranks can run on here: the CUDA devices, or ``nproc`` when ranks share one
    GPU (``enabled()``) and there is one; 0 when torch or CUDA is missing."""
    try:
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a torch that cannot even answer: no GPU to run on
        return 0
    return max(have, nproc) if enabled() and have >= 1 else have


def rank_environment(environ: dict) -> dict[str, str]:
    """The variables a torchrun rank gets so that it looks like the only rank of its node."""
    rank = str(environ.get("RANK", "")).strip()
    if not rank.isdigit():
        raise RuntimeError("mbridge_ep_overlap.lab.shared_gpu runs under torchrun (RANK is not set)")
    return {**{k: v for k, v in _NCCL_DEFAULTS.items() if not environ.get(k)},
            "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NCCL_HOSTID": f"{HOSTID_PREFIX}{rank}"}


def active(environ: dict | None = None) -> bool:
    """Whether this process is a rank started through this module."""
    return (environ if environ is not None else os.environ).get("NCCL_HOSTID", "").startswith(HOSTID_PREFIX)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: torchrun ... --module mbridge_ep_overlap.lab.shared_gpu SCRIPT [ARGS...]")
    os.environ.update(rank_environment(os.environ))
    script = os.path.abspath(argv[0])
    sys.argv = [script, *argv[1:]]
    sys.path.insert(0, os.path.dirname(script))  # as `python SCRIPT` would
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
