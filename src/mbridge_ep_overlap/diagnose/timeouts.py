"""Hangs read from the timeout lines themselves, when no flight recorder or watchdog was there.

Contract
--------
``TimeoutLines.feed(text, where)`` keeps, boundedly, the fields of the timeout lines that name where the
ranks stopped:

- torch's NCCL watchdog (``ProcessGroupNCCL.cpp``): ``[... Rank R] Watchdog caught collective operation
  timeout: WorkNCCL(SeqNum=S, OpType=OP, NumelIn=I, NumelOut=O, Timeout(ms)=T) ran for M milliseconds``;
- HybridEP's NVLink allgather (``csrc/hybrid_ep/extension/allgather.cu``): ``expecting E got G``, where
  each rank of the NVLink domain raises the flag by one per call, so ``E - G`` rank-calls are missing;
- DeepEP's CPU-side wait (``timeout (dispatch CPU)`` / ``(combine CPU)``) and its kernels' timeouts
  (``DeepEP timeout for dispatch receivers, rank R, ...``, ``DeepEP dispatch forwarder timeout (RDMA meta), ...``).

``details(findings)`` adds to the matching hang findings (``nccl-watchdog-timeout``,
``hybridep-allgather-short``, ``deepep-dispatch-timeout``, ``deepep-kernel-timeout``) what the lines say:
the collective or op, the ranks and sequence numbers, the shortfall, and the usual causes ranked, most
likely first, with how sure the evidence makes them. Reads nothing but the lines; never raises for them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .report import Finding

MAX_RECORDS = 64
_NCCL = re.compile(r"Rank (?P<rank>\d+)\]\s*Watchdog caught collective operation timeout: WorkNCCL\("
                   r"SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel_in>-?\d+), NumelOut=(?P<numel_out>-?\d+))?"
                   r".*?Timeout\(ms\)=(?P<timeout>\d+)\)(?: ran for (?P<ran>\d+) milliseconds)?")
_HYBRID = re.compile(r"HYBRID-EP ALLGATHER TIMEOUT:SM (?P<sm>\d+) \[\d+\]:expecting (?P<expected>\d+) got (?P<got>\d+)")
_DEEPEP_CPU = re.compile(r"DeepEP error: timeout \((?P<op>dispatch|combine) CPU\)")
_DEEPEP_KERNEL = re.compile(r"DeepEP (?:timeout for (?P<op1>dispatch|combine) (?P<role1>senders|receivers)|"
                            r"(?P<op2>dispatch|combine) (?P<role2>[\w ()]*?) ?timeout(?: (?P<paren>\([\w ]+\)))?|"
                            r"RDMA sender coordinator timeout)"
                            r"(?P<rest>.*)")
_RANK_FIELD = re.compile(r"\brank (\d+)|\bRDMA: (\d+), nvl: (\d+)")
_ALL_TO_ALL = ("ALLTOALL", "ALLTOALL_BASE", "ALLTOALLV")


@dataclass(frozen=True)
class NcclTimeout:
    rank: int
    sequence: int
    op: str
    numel_in: str
    numel_out: str
    timeout_ms: int
    ran_ms: str


@dataclass
class TimeoutLines:
    nccl: list[NcclTimeout] = field(default_factory=list)
    hybrid: list[tuple[int, int]] = field(default_factory=list)
    """(expected, got) of each HybridEP allgather timeout line."""
    deepep_cpu: set[str] = field(default_factory=set)
    deepep_kernel: list[tuple[str, str, str]] = field(default_factory=list)
    """(op, role, the ranks the line names)."""

    def feed(self, text: str, where: str) -> None:
        if "imeout" not in text and "TIMEOUT" not in text:
            return
        if (m := _NCCL.search(text)) and len(self.nccl) < MAX_RECORDS:
            self.nccl.append(NcclTimeout(int(m["rank"]), int(m["seq"]), m["op"], m["numel_in"] or "?",
                                         m["numel_out"] or "?", int(m["timeout"]), m["ran"] or "?"))
        elif (m := _HYBRID.search(text)) and len(self.hybrid) < MAX_RECORDS:
            self.hybrid.append((int(m["expected"]), int(m["got"])))
        elif m := _DEEPEP_CPU.search(text):
            self.deepep_cpu.add(m["op"])
        elif (m := _DEEPEP_KERNEL.search(text)) and len(self.deepep_kernel) < MAX_RECORDS:
            op = m["op1"] or m["op2"] or "dispatch"
            role = " ".join(x for x in (m["role1"] or m["role2"] or "RDMA sender coordinator", m["paren"]) if x)
            ranks = ", ".join(f"rank {r}" if r else f"RDMA rank {a}, NVLink rank {b}"
                              for r, a, b in _RANK_FIELD.findall(m["rest"] or "")[:1])
            self.deepep_kernel.append((op, role, ranks))

    def details(self, findings: dict[str, Finding]) -> None:
        if (f := findings.get("nccl-watchdog-timeout")) and self.nccl:
            f.detail += self._nccl_words()
        if (f := findings.get("hybridep-allgather-short")) and self.hybrid:
            f.detail += self._hybrid_words()
        if (f := findings.get("deepep-dispatch-timeout")) and self.deepep_cpu:
            f.detail += _ranked(f"DeepEP's CPU-side wait in {' and '.join(sorted(self.deepep_cpu))} timed out", [
                ("likely", "a peer rank did not reach the same dispatch/combine (it diverged, stalled or died first: "
                           "the first error in the other ranks' logs is the cause)"),
                ("possible", "the internode RDMA / NVSHMEM path is not delivering (the receive counters stay -1 when "
                             "DeepEP prints them; DeepEP's own internode test on the same nodes)"),
                ("possible", "a DeepEP x NVSHMEM build pairing that never completes the queue-pair set-up (the run's "
                             "facts record both versions)")])
        if (f := findings.get("deepep-kernel-timeout")) and self.deepep_kernel:
            f.detail += self._kernel_words()

    def _nccl_words(self) -> list[str]:
        """Each rank's timed-out collectives. The lines do not name the process group and sequence numbers
        count per group, so ranks are compared by the (op, sequence number) pairs they report, not by order."""
        per_rank: dict[int, list[NcclTimeout]] = {}
        for t in self.nccl:
            if all((o.op, o.sequence) != (t.op, t.sequence) for o in per_rank.setdefault(t.rank, [])):
                per_rank[t.rank].append(t)
        out = []
        for rank, ts in sorted(per_rank.items()):
            out.append(f"rank {rank}: " + "; ".join(
                f"{t.op} (sequence number {t.sequence}, NumelIn={t.numel_in}, NumelOut={t.numel_out}) ran {t.ran_ms} ms "
                f"against a {t.timeout_ms} ms timeout" for t in ts[:4]) + (f"; {len(ts) - 4} more" if len(ts) > 4 else ""))
        pairs = {rank: {(t.op, t.sequence) for t in ts} for rank, ts in per_rank.items()}
        differ = len(per_rank) > 1 and len({frozenset(v) for v in pairs.values()}) > 1
        ops = sorted({t.op for t in self.nccl})
        if differ:
            common = set.intersection(*pairs.values())
            odd = sorted(r for r, v in pairs.items() if v - common)
            first = ("likely", f"the ranks timed out in different collectives (rank(s) {odd} report ones the others "
                               "do not): their schedules diverged, one rank is in a different code path and never "
                               "issued what the others wait in")
        else:
            first = ("possible", "one rank is in a different code path and never issued this collective (look for a "
                                 "rank that logged no timeout line, or whose stack is elsewhere)")
        causes = [first]
        if set(ops) & set(_ALL_TO_ALL):
            causes.append(("possible", "the ranks disagree on the all-to-all's split sizes (token counts per expert "
                                       "routed differently, or a rank with zero tokens), so one waits for data that is "
                                       "never sent"))
        causes.append(("less likely" if differ else "possible",
                       "the transport stalled (IB / RoCE / NVLink): every rank in the same collective with nothing else "
                       "wrong points there (NCCL_DEBUG=INFO, nccl-tests on the same nodes)"))
        return out + _ranked(f"NCCL {'/'.join(ops)} timed out", causes)

    def _hybrid_words(self) -> list[str]:
        pairs = sorted(set(self.hybrid))
        shorts = sorted({e - g for e, g in pairs})
        shown = "; ".join(f"expecting {e} got {g}" for e, g in pairs[:4])
        out = [f"HybridEP allgather: {shown} ({len(self.hybrid)} line(s)): {', '.join(map(str, shorts))} rank-call(s) "
               "missing (each rank of the NVLink domain raises the flag by one per call)"]
        one = shorts == [1]
        return out + _ranked("HybridEP's allgather waited for too few ranks", [
            ("likely" if one else "possible",
             "one rank issued fewer HybridEP calls than the others (a different number of dispatches in the step: "
             "CUDA graphs on some ranks only, a skipped or extra microbatch, uneven sequence packing)"),
            ("possible" if one else "likely", "a rank stopped before this call (its own error or a hang elsewhere)"),
            ("less likely", "the NVLink domain HybridEP was built for does not match the run's ranks per node")])

    def _kernel_words(self) -> list[str]:
        seen = sorted(set(self.deepep_kernel))
        out = [f"DeepEP {op} {role}" + (f" ({ranks})" if ranks else "") for op, role, ranks in seen[:6]]
        network = any("RDMA" in role or "forwarder" in role or "coordinator" in role for _, role, _ in seen)
        return out + _ranked("a DeepEP kernel timed out", [
            ("likely" if network else "possible",
             "the internode RDMA / NVSHMEM path (the timed-out role is an RDMA forwarder, sender or receiver)"
             if network else "the NVLink path or a peer's kernel that never ran"),
            ("possible" if network else "likely",
             "a peer rank did not enter the same dispatch/combine (it diverged or died first)")])


SURENESS = ("likely", "possible", "less likely")


def _ranked(what: str, causes: list[tuple[str, str]]) -> list[str]:
    """The causes ordered by how sure the evidence makes them (stable within one degree)."""
    ordered = sorted(causes, key=lambda c: SURENESS.index(c[0]))
    return [f"{what}; usual causes, most likely first:"] + [f"  {i}. ({sure}) {text}" for i, (sure, text) in
                                                           enumerate(ordered, 1)]
