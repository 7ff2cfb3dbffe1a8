"""Overlap efficiency from a GPU kernel trace: how much of the all-to-all time was hidden, and
where the rest of the step went.

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

Where the step went (every value per iteration, seconds):

* ``busy_s`` (union of all kernels, whole window) and ``idle_step_s`` = window minus that union,
  per iteration: time no kernel ran (CPU launch gaps, host syncs, the step boundary, profiler).
* ``breakdown_step_s``: the window cut into disjoint parts that add up to ``measured_step_s``:
  ``compute_only``, ``a2a_only`` (= exposed all-to-all), ``both`` (= hidden all-to-all),
  ``comm_only`` (other collectives with neither compute nor all-to-all beside them) and ``idle``.
* ``phases``: the same cut inside and outside the *overlapped span* of each iteration - from its
  first to its last overlapped pair (an all-to-all kernel running beside a compute kernel for at
  least ``_MIN_PAIR_US``). Outside the span lie the first forward (nothing to pair it with yet), the
  last backward, the DP gradient reduction and the optimizer step. These are found from kernel
  timestamps alone: iterations are told apart by the optimizer's kernels (multi-tensor / Adam
  kernels, ``_OPTIMIZER``) when they are recognized, else by the largest gaps between overlapped
  pairs; ``first_forward_s`` / ``last_backward_s`` / ``optimizer_s`` are ``None`` (with a note)
  when no optimizer kernel was recognized, since the boundary inside the gap is then unknown.
  ``phases`` is ``None`` when nothing was overlapped (overlap off, or no all-to-all recognized).

NCCL kernel time includes waiting for the peer rank, so ``a2a_s`` is an upper bound on transfer
time; the hidden fraction is therefore conservative. The window's wall time and the kernels'
clock are not aligned: the window time not covered by the kernels' extent (profiler start, the
step-end synchronize) is counted as idle outside the spans (``unlocated_step_s``).
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
# The optimizer step's kernels (still compute): torch's foreach / fused Adam(W), apex / TE
# multi-tensor kernels (grad-norm, clipping, Adam). They mark the step boundary.
_OPTIMIZER = re.compile(r"multi_tensor_apply|adam|multi_tensor_l2norm|multi_tensor_scale", re.IGNORECASE)
_MIN_PAIR_US = 20.0
"""An overlapped pair: all-to-all beside compute for at least this long (shorter coincidences of a
small kernel with an all-to-all are not the schedule's pairing)."""
_MIN_HIDDEN_SHARE = 0.02
"""Below this hidden fraction nothing was overlapped (overlap off shows ~1e-5 of chance coincidence)."""


def classify(kernel_name: str) -> str:
    """'a2a', 'comm' (other collectives) or 'compute'."""
    if _NCCL.search(kernel_name):
        return "a2a" if _A2A.search(kernel_name) else "comm"
    if _FLEX_A2A.search(kernel_name):
        return "a2a"
    return "compute"


def is_optimizer(kernel_name: str) -> bool:
    return classify(kernel_name) == "compute" and _OPTIMIZER.search(kernel_name) is not None


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


def _complement(intervals: Sequence[Interval], lo: float, hi: float) -> list[Interval]:
    """[lo, hi] minus a union (sorted, disjoint)."""
    out, cur = [], lo
    for a, b in intervals:
        if b <= cur:
            continue
        if a > cur:
            out.append((cur, min(a, hi)))
        cur = max(cur, b)
        if cur >= hi:
            break
    if cur < hi:
        out.append((cur, hi))
    return [i for i in out if i[1] > i[0]]


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
    # where the step went (defaults keep old call sites and old results valid)
    busy_s: float | None = None
    idle_step_s: float | None = None
    breakdown_step_s: dict | None = None
    phases: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class _Classes:
    """The unions of one trace, and the disjoint parts of any set of time spans."""

    def __init__(self, compute: list[Interval], a2a: list[Interval], comm: list[Interval]):
        self.compute, self.a2a, self.comm = compute, a2a, comm
        self.both = intersection(compute, a2a)
        self.compute_or_a2a = union(compute + a2a)
        self.any = union(compute + a2a + comm)

    def parts(self, spans: Sequence[Interval]) -> dict[str, float]:
        """Lengths (trace units) of the disjoint parts of ``spans`` (sorted, disjoint)."""
        spans = list(spans)

        def within(x: Sequence[Interval]) -> float:
            return length(intersection(x, spans))

        both, c, a = within(self.both), within(self.compute), within(self.a2a)
        ca, anything = within(self.compute_or_a2a), within(self.any)
        return {"compute_only": c - both, "a2a_only": a - both, "both": both, "comm_only": anything - ca,
                "idle": length(spans) - anything}


def _scaled(parts: dict[str, float], factor: float) -> dict[str, float]:
    return {k: v * factor for k, v in parts.items()}


def _iteration_groups(pairs: list[Interval], optimizer: list[Interval], n: int) -> tuple[list[list[Interval]], str]:
    """Overlapped pairs grouped by iteration: split at optimizer phases when those are recognized
    and give ``n`` groups, else at the ``n - 1`` largest gaps between pairs."""
    if optimizer:
        groups: list[list[Interval]] = [[]]
        k = 0
        for p in pairs:
            # an optimizer interval between the previous pair and this one closes an iteration
            while k < len(optimizer) and optimizer[k][1] <= p[0]:
                if groups[-1]:
                    groups.append([])
                k += 1
            groups[-1].append(p)
        groups = [g for g in groups if g]
        if len(groups) == n:
            return groups, "iterations split at the optimizer kernels"
    if n <= 1 or len(pairs) < n:
        return [pairs], "one overlapped span" if n <= 1 else "fewer overlapped pairs than iterations: one span"
    gaps = sorted(range(1, len(pairs)), key=lambda i: pairs[i][0] - pairs[i - 1][1], reverse=True)[: n - 1]
    cuts = sorted(gaps)
    groups, start = [], 0
    for c in cuts:
        groups.append(pairs[start:c])
        start = c
    groups.append(pairs[start:])
    why = "no optimizer kernel recognized" if not optimizer else "the optimizer kernels did not give one group per iteration"
    return groups, f"iterations split at the largest gaps between overlapped pairs ({why})"


def _phases(cls: _Classes, optimizer: list[Interval], extent: Interval, n: int, unlocated: float,
            scale: float) -> dict | None:
    a2a_len = length(cls.a2a)
    pairs = [p for p in cls.both if p[1] - p[0] >= _MIN_PAIR_US]
    if not a2a_len or not pairs or length(cls.both) < _MIN_HIDDEN_SHARE * a2a_len:
        return None
    groups, how = _iteration_groups(pairs, optimizer, n)
    spans = [(g[0][0], g[-1][1]) for g in groups]
    outside = _complement(spans, *extent)
    inside_parts, outside_parts = cls.parts(spans), cls.parts(outside)
    outside_parts["idle"] += unlocated
    per = scale / max(n, 1)
    gaps_between = [spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1)]
    inner_gaps = [b[0] - a[1] for g in groups for a, b in zip(g, g[1:])]
    out = {
        "iterations_found": len(spans),
        "how": how,
        "overlapped_span_step_s": length(spans) * per,
        "outside_step_s": (length(outside) + unlocated) * per,
        "unlocated_step_s": unlocated * per,
        "inside": _scaled(inside_parts, per),
        "outside": _scaled(outside_parts, per),
        "largest_gap_between_spans_s": max(gaps_between) * scale if gaps_between else None,
        "largest_gap_inside_spans_s": max(inner_gaps) * scale if inner_gaps else 0.0,
        "first_forward_s": None,
        "last_backward_s": None,
        "optimizer_s": None,
        "note": "",
    }
    if not optimizer:
        out["note"] = ("no optimizer kernel recognized: the time outside the overlapped spans is not split into "
                       "last backward / optimizer / first forward")
        return out
    first_forward = last_backward = opt_time = 0.0
    for i, (s, e) in enumerate(spans):
        nxt = spans[i + 1][0] if i + 1 < len(spans) else extent[1]
        if i == 0:
            first_forward += s - extent[0]
        gap_opt = [o for o in optimizer if o[0] >= e and o[1] <= nxt]
        if not gap_opt:
            out["note"] = f"no optimizer kernel after overlapped span {i + 1}: phases not split"
            return out
        last_backward += gap_opt[0][0] - e
        if i + 1 < len(spans):
            opt_time += gap_opt[-1][1] - gap_opt[0][0]
            first_forward += nxt - gap_opt[-1][1]
        else:  # the last iteration: the optimizer and whatever follows it up to the last kernel
            opt_time += extent[1] - gap_opt[0][0]
    out["first_forward_s"] = first_forward * per
    out["last_backward_s"] = last_backward * per
    out["optimizer_s"] = opt_time * per
    out["note"] = "optimizer_s: from its first kernel to the next iteration's first kernel (includes the step boundary)"
    return out


def analyze(kernels: Iterable[dict], iterations: int, measured_window_s: float) -> OverlapEfficiency:
    """``kernels``: dicts with ``name``, ``ts`` and ``dur`` (any one time unit, here microseconds)."""
    by_class: dict[str, list[Interval]] = {"a2a": [], "comm": [], "compute": []}
    optimizer_raw: list[Interval] = []
    for k in kernels:
        interval = (float(k["ts"]), float(k["ts"]) + float(k["dur"]))
        kind = classify(k["name"])
        by_class[kind].append(interval)
        if kind == "compute" and _OPTIMIZER.search(k["name"]):
            optimizer_raw.append(interval)
    a2a, comm, compute = (union(by_class[c]) for c in ("a2a", "comm", "compute"))
    hidden = length(intersection(a2a, compute))
    a2a_len, compute_len = length(a2a), length(compute)
    scale = 1e-6  # microseconds -> seconds
    n = max(iterations, 1)
    cls = _Classes(compute, a2a, comm)
    busy = length(cls.any)
    window = measured_window_s / scale
    extent = (cls.any[0][0], cls.any[-1][1]) if cls.any else (0.0, 0.0)
    unlocated = max(window - (extent[1] - extent[0]), 0.0)
    parts = cls.parts([extent] if cls.any else [])
    parts["idle"] += unlocated
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
        busy_s=busy * scale,
        idle_step_s=max(window - busy, 0.0) * scale / n,
        breakdown_step_s=_scaled(parts, scale / n),
        phases=_phases(cls, union(optimizer_raw), extent, n, unlocated, scale),
    )
