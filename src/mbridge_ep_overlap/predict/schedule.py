"""Two-stream replay of one training step, overlap off and on, as Megatron-Core 0.19.2 issues it.

Contract
--------
``simulate_chunk(costs, layers, m, overlap)`` replays ``m`` microbatches of one model chunk (a
list of layer kinds, ``"moe"`` / ``"dense"`` / ``"mtp"``) and returns ``SimResult`` (makespan,
all-to-all busy time, the part of it that coincides with compute). ``step_times(...)`` turns
chunk results into step times with pipeline parallelism, the parts that cannot overlap and the
per-step optimizer / DP sync.

The order of nodes is the order Megatron-Core 0.19.2 issues them (file and line references are to
``megatron/core`` as installed):

* overlap on, no pipelining: ``pipeline_parallel/combined_1f1b.py:35``
  ``combined_1f1b_schedule_for_no_pipelining``: the first microbatch's forward runs alone (line
  76), then ``num_microbatches - 1`` combined steps each pairing the forward of microbatch i+1
  with the backward of microbatch i, then the last microbatch's backward alone (line 119);
* inside a combined step: ``models/common/model_chunk_schedule_plan.py:488``
  ``TransformerModelChunkSchedulePlan.run`` - forward embedding, loss/output-layer backward,
  then per layer ``TransformerLayerSchedulePlan.run`` (line 224) on forward layer i and backward
  layer L-1-i, then the output layer forward and the embedding backward;
* inside ``TransformerLayerSchedulePlan.run``: combine backward (comm stream, line 251), attention
  forward (compute, 255), expert MLP backward (compute, 258), dispatch forward (comm, 262),
  dispatch backward (comm, 266), expert MLP forward (compute, 273), combine forward (comm, 277),
  attention backward (compute, 280). So the combine's backward hides behind the attention
  forward, the dispatch behind the expert-MLP backward, the dispatch's backward and the combine
  behind the expert-MLP forward / attention backward of the other microbatch. Dispatch and
  combine are created on the comm stream, everything else on the compute stream (lines
  160-163);
* with ``delay_wgrad_compute`` the expert wgrad (``b_layer.mlp.backward_dw()``, line 266) runs after
  the dispatch forward and the attention / shared-expert wgrad after the attention backward (line
  293), both outside the microbatch's event chain (``Costs.expert_wgrad`` / ``attn_wgrad``);
* nodes of one microbatch share one CUDA event (``pipeline_parallel/utils.py:207``), so each
  microbatch's nodes run in issue order across both streams; nodes of the two microbatches only
  meet at stream order;
* the alltoall dispatcher makes the CPU wait for the device-to-host copy of the routing counts
  before the dispatch all-to-all (``transformer/moe/token_dispatcher.py:590`` /
  ``:950``): the CPU cannot issue further work until the attention forward has finished.

A host stall at each microbatch start (the batch copy, fitted: ``Costs.host_per_microbatch``)
waits for the compute stream to drain and keeps it idle; the comm stream keeps running queued
all-to-alls meanwhile (that is how the bench's throttled runs hide most of it).

Beside each other, compute nodes slow down by ``contention`` x (time overlapped with an
all-to-all) and all-to-alls by ``comm_slowdown`` x (time overlapped with compute); the replay
iterates three times to settle both. With the default stream priority an all-to-all that becomes
ready while a compute node runs starts only after ``delay`` x that node's duration (``_run``).
Stdlib only.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from .costs import Costs

COMP, COMM = 0, 1
K_COMP, K_A2A, K_POST, K_HOST = 0, 1, 2, 3


@dataclass(frozen=True)
class SimResult:
    makespan: float  # seconds from the first issue to the last node's end
    a2a_busy: float  # all-to-all node time
    a2a_hidden: float  # all-to-all time during which the compute stream computes
    compute_busy: float  # compute-stream busy time (after contention)


class _Prog:
    """Nodes in issue order: stream, duration, kind, deps, CPU-sync nodes, contention."""

    def __init__(self) -> None:
        self.stream: list[int] = []
        self.dur: list[float] = []
        self.kind: list[int] = []
        self.deps: list[int] = []  # single predecessor (-1: none) - chains are linear
        self.sync: list[tuple[int, ...]] = []
        self.kappa: list[float] = []
        self.sigma: list[float] = []
        self.sync_cost: list[float] = []
        self.last_on: dict[int, int] = {COMP: -1, COMM: -1}

    def add(self, stream: int, dur: float, kind: int, dep: int, sync: tuple[int, ...] = (), kappa: float = 0.0,
            sigma: float = 0.0, sync_cost: float = 0.0) -> int:
        self.stream.append(stream)
        self.dur.append(dur)
        self.kind.append(kind)
        self.deps.append(dep)
        self.sync.append(sync)
        self.kappa.append(kappa)
        self.sigma.append(sigma)
        self.sync_cost.append(sync_cost)
        idx = len(self.dur) - 1
        if kind != K_HOST:
            self.last_on[stream] = idx
        return idx


def _run(p: _Prog, extra: list[float], delay: float = 0.0) -> tuple[list[float], list[float]]:
    """One pass in issue order. ``delay``: an all-to-all that becomes ready while a compute node
    runs starts only after ``delay`` x that node's duration (at most when it ends) - a
    default-priority stream gets SMs only as the running kernel drains."""
    n = len(p.dur)
    start = [0.0] * n
    end = [0.0] * n
    cpu = 0.0
    free = [0.0, 0.0]
    cstart: list[float] = []  # compute-stream intervals so far (FIFO: sorted, disjoint)
    cend: list[float] = []
    for i in range(n):
        if p.kind[i] == K_HOST:
            cpu = max(cpu, free[COMP]) + p.dur[i]
            start[i] = end[i] = cpu
            continue
        if p.sync[i]:
            for s in p.sync[i]:
                if s >= 0 and end[s] > cpu:
                    cpu = end[s]
            cpu += p.sync_cost[i]
        st = cpu
        s = p.stream[i]
        if free[s] > st:
            st = free[s]
        d = p.deps[i]
        if d >= 0 and end[d] > st:
            st = end[d]
        if delay and p.kind[i] == K_A2A and cstart:
            j = bisect_right(cstart, st) - 1
            if j >= 0 and cend[j] > st:
                st = min(cend[j], st + delay * (cend[j] - cstart[j]))
        start[i] = st
        end[i] = st + p.dur[i] + extra[i]
        free[s] = end[i]
        if s == COMP and p.kind[i] == K_COMP and end[i] > st:
            cstart.append(st)
            cend.append(end[i])
    return start, end


def _overlaps(p: _Prog, start: list[float], end: list[float]) -> tuple[list[float], float]:
    """Per node: the extra time contention adds (compute: kappa x overlap with all-to-alls;
    all-to-all: sigma x overlap with compute); and the total hidden all-to-all time."""
    comm = [(start[i], end[i], p.kappa[i], i) for i in range(len(p.dur)) if p.kind[i] == K_A2A and end[i] > start[i]]
    comp = [i for i in range(len(p.dur)) if p.kind[i] == K_COMP and p.stream[i] == COMP and end[i] > start[i]]
    comm.sort()
    comp.sort(key=lambda i: start[i])
    extra = [0.0] * len(p.dur)
    hidden = 0.0
    j0 = 0
    for i in comp:
        a, b = start[i], end[i]
        while j0 < len(comm) and comm[j0][1] <= a:
            j0 += 1
        j = j0
        while j < len(comm) and comm[j][0] < b:
            ov = min(b, comm[j][1]) - max(a, comm[j][0])
            if ov > 0:
                extra[i] += comm[j][2] * ov
                extra[comm[j][3]] += p.sigma[comm[j][3]] * ov
                hidden += ov
            j += 1
    return extra, hidden


def _emit(p: _Prog, c: Costs, fk: str | None, bk: str | None, fdep: int, bdep: int,
          sync_comm: bool) -> tuple[int, int]:
    """Issue one ``TransformerLayerSchedulePlan.run(f_layer, b_layer)`` (either may be None)."""
    a2a, kap, sig = c.a2a.seconds, c.a2a.contention, c.a2a.comm_slowdown
    f_moe = fk in ("moe", "mtp")
    b_moe = bk in ("moe", "mtp")
    # b: combine backward (postprocess backward, then the all-to-all)
    if bk is not None and b_moe:
        bdep = p.add(COMM, c.combine_post_b, K_POST, bdep)
        bdep = p.add(COMM, a2a, K_A2A, bdep, kappa=kap, sigma=sig)
    attn_f = -1
    if fk is not None:
        d = c.attn_f + c.tp_comm_f + (c.moe_pre_f if f_moe else 0.0) + (c.mtp_extra_f if fk == "mtp" else 0.0)
        attn_f = fdep = p.add(COMP, d, K_COMP, fdep)
    if bk is not None:
        bdep = p.add(COMP, c.expert_b - c.expert_wgrad if b_moe else c.dense_mlp_b, K_COMP, bdep)
    if fk is not None and f_moe:
        sync: tuple[int, ...] = (attn_f,) if c.sync_per_dispatch else ()
        if sync_comm and c.sync_per_dispatch:
            sync = (attn_f, p.last_on[COMM])
        fdep = p.add(COMM, a2a, K_A2A, fdep, sync=sync, kappa=kap, sigma=sig, sync_cost=c.dispatch_sync_s)
    if bk is not None and b_moe and c.expert_wgrad:
        # delayed wgrad (line 266 b_layer.mlp.backward_dw): the expert wgrad GEMMs run on the compute
        # stream outside the microbatch's event chain, so the dispatch backward below waits only
        # for the dgrad (models/common/utils.py backward_dw records no event)
        p.add(COMP, c.expert_wgrad, K_COMP, -1)
    if bk is not None and b_moe:
        bdep = p.add(COMM, a2a, K_A2A, bdep, kappa=kap, sigma=sig)
    if fk is not None:
        fdep = p.add(COMP, c.expert_f if f_moe else c.dense_mlp_f, K_COMP, fdep)
        if f_moe:
            fdep = p.add(COMM, a2a, K_A2A, fdep, kappa=kap, sigma=sig)
            fdep = p.add(COMM, c.combine_post_f, K_POST, fdep)
    if bk is not None:
        d = c.attn_b + c.tp_comm_b + (c.moe_pre_b if b_moe else 0.0) + (c.mtp_extra_b if bk == "mtp" else 0.0)
        bdep = p.add(COMP, d - (c.attn_wgrad if b_moe else 0.0), K_COMP, bdep)
        if b_moe and c.attn_wgrad:
            # pre_dispatch_computation.backward_dw (line 293): attention and shared-expert wgrad after
            # the attention dgrad, outside the chain (the next layer's combine backward need not wait)
            p.add(COMP, c.attn_wgrad, K_COMP, -1)
    return fdep, bdep


def build_overlap_program(c: Costs, layers: list[str], m: int, *, first_chunk: bool = True,
                          last_chunk: bool = True, sync_comm: bool = False) -> _Prog:
    """Issue order of ``combined_1f1b_schedule_for_no_pipelining`` for ``m`` microbatches."""
    p = _Prog()
    L = len(layers)
    fend: dict[int, int] = {}  # microbatch -> its last forward node (loss)
    for step in range(m + 1):
        f = step if step < m else None
        b = step - 1 if step >= 1 else None
        fdep = bdep = -1
        if f is not None:
            p.add(COMP, c.host_per_microbatch, K_HOST, -1)
            fdep = p.add(COMP, c.embed_f if first_chunk else 0.0, K_COMP, -1)
        if b is not None:
            bdep = p.add(COMP, c.head_b if last_chunk else 0.0, K_COMP, fend[b])
        nf = L if f is not None else 0
        nb = L if b is not None else 0
        for i in range(max(nf, nb)):
            fk = layers[i] if i < nf else None
            bk = layers[L - 1 - i] if i < nb else None
            if fk is not None and bk is not None:
                fdep, bdep = _emit(p, c, fk, bk, fdep, bdep, sync_comm)
            elif bk is not None:
                _, bdep = _emit(p, c, None, bk, -1, bdep, sync_comm)
            else:
                fdep, _ = _emit(p, c, fk, None, fdep, -1, sync_comm)
        if f is not None:
            fend[f] = p.add(COMP, c.head_f if last_chunk else 0.0, K_COMP, fdep)
        if b is not None:
            p.add(COMP, c.embed_b if first_chunk else 0.0, K_COMP, bdep)
    return p


def simulate_overlap(c: Costs, layers: list[str], m: int, *, first_chunk: bool = True,
                     last_chunk: bool = True, sync_comm: bool = False, delay: float = 0.0,
                     iterations: int = 3) -> SimResult:
    """Replay the combined-1F1B schedule (overlap on) for ``m`` microbatches of one chunk."""
    p = build_overlap_program(c, layers, m, first_chunk=first_chunk, last_chunk=last_chunk, sync_comm=sync_comm)
    extra = [0.0] * len(p.dur)
    hidden = 0.0
    for _ in range(iterations):
        start, end = _run(p, extra, delay)
        extra, hidden = _overlaps(p, start, end)
    start, end = _run(p, extra, delay)
    _, hidden = _overlaps(p, start, end)
    a2a = sum(p.dur[i] + extra[i] for i in range(len(p.dur)) if p.kind[i] == K_A2A)
    comp = sum(p.dur[i] + extra[i] for i in range(len(p.dur)) if p.kind[i] in (K_COMP, K_POST))
    return SimResult(makespan=max(end) if end else 0.0, a2a_busy=a2a, a2a_hidden=hidden, compute_busy=comp)


def microbatch_off(c: Costs, layers: list[str], *, first_chunk: bool = True,
                   last_chunk: bool = True) -> tuple[float, float, float]:
    """Overlap off: one microbatch's (forward, backward, all-to-all + dispatch-sync) seconds;
    everything is serial (the all-to-all runs in the compute stream's order), so these are sums.
    The third value is the part of forward + backward that is not compute."""
    a2a = c.a2a.seconds
    fwd = (c.embed_f if first_chunk else 0.0) + (c.head_f if last_chunk else 0.0)
    bwd = (c.embed_b if first_chunk else 0.0) + (c.head_b if last_chunk else 0.0)
    n_a2a = 0
    for k in layers:
        moe = k in ("moe", "mtp")
        fwd += c.attn_f + c.tp_comm_f + (c.expert_f if moe else c.dense_mlp_f)
        bwd += c.attn_b + c.tp_comm_b + (c.expert_b if moe else c.dense_mlp_b)
        if k == "mtp":
            fwd += c.mtp_extra_f
            bwd += c.mtp_extra_b
        if moe:
            fwd += c.moe_pre_f + c.dispatch_sync_s
            bwd += c.moe_pre_b
            fwd += 2 * a2a + c.combine_post_f
            bwd += 2 * a2a + c.combine_post_b
            n_a2a += 4
    return fwd, bwd, n_a2a * a2a + (n_a2a // 4) * c.dispatch_sync_s


def steady_overlap(c: Costs, layers: list[str], m: int, **kw) -> SimResult:
    """``simulate_overlap`` for any m: replays up to 6 microbatches and extends the steady state
    (the difference between 6 and 5) linearly beyond."""
    if m <= 6:
        return simulate_overlap(c, layers, m, **kw)
    r5 = simulate_overlap(c, layers, 5, **kw)
    r6 = simulate_overlap(c, layers, 6, **kw)
    n = m - 6

    def ext(a: float, b: float) -> float:
        return b + n * (b - a)

    return SimResult(makespan=ext(r5.makespan, r6.makespan), a2a_busy=ext(r5.a2a_busy, r6.a2a_busy),
                     a2a_hidden=ext(r5.a2a_hidden, r6.a2a_hidden), compute_busy=ext(r5.compute_busy, r6.compute_busy))
