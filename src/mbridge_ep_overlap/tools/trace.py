"""Overlap efficiency from a GPU kernel trace: how much of the all-to-all time was hidden.

Contract
--------
Input: the CUDA kernels of one rank over a few steady iterations (name, start, duration; as
``evidence.RunRecorder`` exports them from the torch profiler) and the wall time of those
iterations. Kernels are classified by name: NCCL kernels are communication, and among them
send/recv / all-to-all kernels are the expert-parallel all-to-all, as are DeepEP's and HybridEP's
dispatch/combine kernels; everything else is compute.
We never sum kernel times (concurrent kernels would be double counted): we take the *union* of
intervals per class and report

* ``comm_s`` / ``a2a_s`` / ``compute_s``: busy time of each class (union lengths);
* ``hidden_s``: all-to-all time that coincides with compute; ``exposed_s`` = ``a2a_s - hidden_s``;
* ``hidden_fraction`` = ``hidden_s / a2a_s`` (``None`` when no all-to-all kernel was recognized:
  then the dispatcher's kernels are unknown to ``classify`` and the fraction would be meaningless);
* ``ideal_step_s`` = max(compute, a2a) per iteration beside ``measured_step_s``.

NCCL kernel time includes waiting for the peer rank, so ``a2a_s`` is an upper bound on transfer
time; the hidden fraction is therefore conservative.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

Interval = tuple[float, float]

_NCCL = re.compile(r"nccl", re.IGNORECASE)
_A2A = re.compile(r"SendRecv|AllToAll|all_to_all|alltoall", re.IGNORECASE)
# The flex dispatchers move tokens with their own kernels, not NCCL: DeepEP's
# deep_ep::{intranode,internode,internode_ll}::{notify_dispatch,dispatch,combine,...} and
# HybridEP's hybrid_ep::{dispatch_kernel,combine_kernel,device_sync_kernel,rdma_sync_kernel}.
# Their layout / permute / scan kernels are local work and stay compute.
_FLEX_A2A = re.compile(
    r"deep_ep::(intranode|internode|internode_ll)::|hybrid_ep::(dispatch_kernel|combine_kernel|device_sync_kernel|rdma_sync_kernel)"
)


def classify(kernel_name: str) -> str:
    """'a2a', 'comm' (other collectives) or 'compute'."""
    if _NCCL.search(kernel_name):
        return "a2a" if _A2A.search(kernel_name) else "comm"
    if _FLEX_A2A.search(kernel_name):
        return "a2a"
    return "compute"


def union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: Sequence[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersection(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two unions (each sorted and disjoint)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


@dataclass(frozen=True)
class OverlapEfficiency:
    iterations: int
    a2a_s: float
    comm_s: float
    compute_s: float
    hidden_s: float
    exposed_s: float
    hidden_fraction: float | None  # None: no all-to-all kernel recognized in the window
    ideal_step_s: float
    measured_step_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def analyze(kernels: Iterable[dict], iterations: int, measured_window_s: float) -> OverlapEfficiency:
    """``kernels``: dicts with ``name``, ``ts`` and ``dur`` (any one time unit, here microseconds)."""
    by_class: dict[str, list[Interval]] = {"a2a": [], "comm": [], "compute": []}
    for k in kernels:
        by_class[classify(k["name"])].append((float(k["ts"]), float(k["ts"]) + float(k["dur"])))
    a2a, comm, compute = (union(by_class[c]) for c in ("a2a", "comm", "compute"))
    hidden = length(intersection(a2a, compute))
    a2a_len, compute_len = length(a2a), length(compute)
    scale = 1e-6  # microseconds -> seconds
    n = max(iterations, 1)
    return OverlapEfficiency(
        iterations=iterations,
        a2a_s=a2a_len * scale,
        comm_s=length(union(a2a + comm)) * scale,
        compute_s=compute_len * scale,
        hidden_s=hidden * scale,
        exposed_s=(a2a_len - hidden) * scale,
        hidden_fraction=hidden / a2a_len if a2a_len else None,
        ideal_step_s=max(compute_len, a2a_len) * scale / n,
        measured_step_s=measured_window_s / n,
    )
