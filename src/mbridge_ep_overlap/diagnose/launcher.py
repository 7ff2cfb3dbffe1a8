"""The launchers' own lines read for what they name: torchrun's failure summary, Slurm's step messages, c10d's store.

Contract
--------
``LauncherLines.feed(text, where, rank)`` reads one line (prefix already taken off; ``rank`` from it or from the
per-rank file, else None): torchrun's failure summary through ``crashes.TorchrunSummary`` (the one reader of its exit
codes), Slurm's cancel lines (``*** JOB|STEP N ON NODE CANCELLED AT T ...``), its OOM-kill lines (the job / step
id), c10d's TCPStore errors (the port, the store's address, a host name that does not resolve), and, per rank, the
first traceback line and the last ``...Error:`` line (what a root-cause rank raised). Bounded: at most
``MAX_RECORDS`` of each kind and ``MAX_RANKS`` ranks.

``details(findings, series)`` runs after the other readers: it raises ``torchrun-rank-killed`` (the root cause died
of SIGKILL: where the log says who killed it, or that it does not), ``torchrun-rank-failed`` (an exit code above 0:
the rank's traceback lines, or that the logs hold none), ``torchrun-ranks-terminated`` (all SIGTERM); a root
cause of SIGSEGV / SIGABRT adds its rank and host to ``segmentation-fault`` / ``abort-signal`` (raised by the crash
reader). A Slurm time limit is judged against the iteration lines (``IterationSeries``, with MB's timestamps):
still completing at a steady pace up to the cancel raises ``slurm-time-limit-too-short`` (the last iteration, the
mean step time, what the remaining iterations need) in place of ``slurm-time-limit``; stopped long before says that
something stopped first. The OOM kill, store and srun findings get their job id, port, address and node. Never
raises for any text.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from dataclasses import dataclass

from . import crashes
from .iterations import IterationSeries
from .runtime_errors import peer_lost
from .report import Finding
from .signatures import all_signatures
from .signatures.launch import TEARDOWN

MAX_RECORDS = 16
MAX_RANKS = 1024
STEADY_SLACK_S = 30.0
"""A time limit hit while steady: the last iteration logged within three logging intervals plus this of the cancel."""

_CANCEL = re.compile(r"\*\*\* (JOB|STEP) (\S+) ON (\S+) CANCELLED AT (\S+)(?: DUE (?:TO|to) ([A-Z a-z]+?))?(?:,.*)? \*\*\*")
_OOM_KILL = re.compile(r"Detected (\d+) oom[-_]kill event.{0,12} in (?:StepId=)?(\d+)(?:\.(\S+?))?\.? Some of|"
                       r"(?<!\S)(\S+): tasks? ([0-9,\-\[\]]+): Out Of Memory")
_TASK_EXIT = re.compile(r"(?<!\S)(\S+): tasks? ([0-9,\-\[\]]+): Exited with exit code (\d+)")
_NODE_FAIL = re.compile(r"Node failure on (\S+)")
_BIND = re.compile(r"The server socket has failed to (?:listen|bind)\b.*?(?:port: (\d+)|:(\d+) \(errno: 98)")
_CONNECT = re.compile(r"The client socket has timed out after (\d+m?s) while trying to connect to \((\S+), (\d+)\)")
_UNRESOLVED = re.compile(r"network addresses of \((\S+), \d+\) cannot be retrieved \(gai error: ([^)]*)\)")
_LOST = re.compile(r"(?<!\w)(\w+) failed on SocketImpl\(.*?remote=([^)]*)\): (Connection reset by peer|Broken pipe|"
                   r"Failed to recv, got 0 bytes)|DistNetworkError: (Connection reset by peer|Broken pipe|"
                   r"Failed to recv, got 0 bytes)")
_KERNEL_OOM = re.compile(r"Out of memory: Killed process \d+|oom-kill:|Memory cgroup out of memory")
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)\b:")
_SELF_EXIT = {"SIGSEGV": "segmentation-fault", "SIGABRT": "abort-signal"}


@dataclass
class _RankErrors:
    traceback: str = ""
    error: str = ""


class LauncherLines:
    def __init__(self) -> None:
        self.summary = crashes.TorchrunSummary()
        self.cancels: list[tuple[str, str, str, str, str, str]] = []  # where, JOB|STEP, id, node, time, reason
        self.oom_kills: list[tuple[str, str]] = []  # where, job id ('' unknown)
        self.kernel_oom: list[str] = []
        self.task_exits: list[tuple[str, str, str, str]] = []  # where, node, tasks, code
        self.node_failures: list[tuple[str, str]] = []
        self.binds: list[tuple[str, str]] = []  # where, port
        self.connects: list[tuple[str, str, str, str]] = []  # where, after, host, port
        self.unresolved: dict[str, str] = {}
        self.lost: list[tuple[str, str, str]] = []  # where, remote, error
        self.ranks: dict[str, _RankErrors] = {}
        self.seen_ranks: set[str] = set()

    def feed(self, text: str, where: str, rank: str | None = None) -> None:
        self.summary.feed(text, where)
        if rank is not None and (rank in self.ranks or len(self.ranks) < MAX_RANKS):
            self._rank_line(text.strip(), where, rank)
        if rank is not None and len(self.seen_ranks) < MAX_RANKS:
            self.seen_ranks.add(rank)
        if "***" in text and (m := _CANCEL.search(text)):
            _keep(self.cancels, (where, *m.groups("")))
        if ("oom" in text or "Out Of Memory" in text) and (m := _OOM_KILL.search(text)):
            _keep(self.oom_kills, (where, m.group(2) or ""))
        if "Exited with exit code" in text and (m := _TASK_EXIT.search(text)):
            _keep(self.task_exits, (where, *m.groups()))
        if "Node failure on" in text and (m := _NODE_FAIL.search(text)):
            _keep(self.node_failures, (where, m.group(1)))
        if "socket" in text or "Socket" in text or "DistNetworkError" in text or "gai error" in text:
            self._store_line(text, where)
        if ("Killed process" in text or "oom-kill" in text or "out of memory" in text) and _KERNEL_OOM.search(text):
            _keep(self.kernel_oom, where)

    def _rank_line(self, text: str, where: str, rank: str) -> None:
        if text.startswith("Traceback (most recent call last)"):
            errors = self.ranks.setdefault(rank, _RankErrors())
            errors.traceback = errors.traceback or where
        elif _ERROR_LINE.match(text):
            self.ranks.setdefault(rank, _RankErrors()).error = f"{where}: {text[:240]}"

    def _store_line(self, text: str, where: str) -> None:
        if "EADDRINUSE" in text or "errno: 98" in text:
            if m := _BIND.search(text):
                _keep(self.binds, (where, m.group(1) or m.group(2)))
        elif m := _CONNECT.search(text):
            _keep(self.connects, (where, *m.groups()))
        elif m := _UNRESOLVED.search(text):
            if len(self.unresolved) < MAX_RECORDS:
                self.unresolved.setdefault(m.group(1), m.group(2))
        elif m := _LOST.search(text):
            _keep(self.lost, (where, m.group(2) or "", m.group(3) or m.group(4)))

    # ---- after reading -----------------------------------------------------------------------------------------
    def details(self, findings: dict[str, Finding], series: IterationSeries) -> None:
        self._torchrun(findings)
        self._first_failure(findings)
        self._time_limit(findings, series)
        self._slurm(findings)
        self._store(findings)

    def _torchrun(self, findings: dict[str, Finding]) -> None:
        roots = self.summary.roots()
        if not roots:
            return
        root = roots[0]
        others = [f for f in self.summary.failures if f is not root and f.rank != root.rank]
        torn = sorted({f.rank for f in others if f.signal in ("SIGTERM", "SIGINT", "SIGHUP")}, key=int)
        head = (f"root cause (torchrun's first observed failure): rank {root.rank} (local rank {root.local_rank or '?'}) "
                f"on host {root.host or '?'}, exit code {root.exitcode}" + (f" ({root.signal})" if root.signal else "")
                + (f", at {root.time}" if root.time else ""))
        torn_words = (f"rank(s) {', '.join(torn)}: -15 (SIGTERM) from torchrun tearing them down after it, not causes"
                      if torn else "")
        if root.signal in _SELF_EXIT:
            f = findings.get(_SELF_EXIT[root.signal])
            if f is not None:
                f.detail.insert(0, head + f" ({root.where.get('exitcode', '?')})")
                if torn_words:
                    f.detail.insert(1, torn_words)
                return
        if root.signal in ("SIGTERM", "SIGINT", "SIGHUP"):
            f = findings.setdefault("torchrun-ranks-terminated", Finding(_SIG["torchrun-ranks-terminated"]))
            self._evidence(f, root)
            f.detail.append(head + "; every rank torchrun lists was terminated: the first failure is elsewhere "
                                   "(another node's log, or the scheduler's messages)")
            return
        sig_id = "torchrun-rank-killed" if root.exitcode == -9 else "torchrun-rank-failed"
        sig = _SIG[sig_id]
        if root.signal and sig_id == "torchrun-rank-failed":  # died of another signal: no exit code of its own
            sig = dataclasses.replace(sig, cause=(
                f"torchrun's root cause is one rank that died of {root.signal} (exit code {root.exitcode}): a signal "
                f"it did not survive (SIGBUS: a bad memory mapping, e.g. a truncated file or /dev/shm too small; SIGILL: "
                f"an instruction this CPU or GPU build does not have; SIGFPE: an integer division by zero in native "
                f"code), and " + TEARDOWN + "."), fix=(
                "read that rank's stderr and faulthandler output for the native frame it died in (PYTHONFAULTHANDLER=1 "
                "prints every thread's Python stack on such a signal)"))
        f = findings.setdefault(sig_id, Finding(sig))
        self._evidence(f, root)
        f.detail.append(head)
        if torn_words:
            f.detail.append(torn_words)
        if sig_id == "torchrun-rank-killed":
            f.detail.append(self._who_killed(root))
            return
        f.detail += self._rank_error(root)

    def _evidence(self, f: Finding, root: crashes.TorchrunFailure) -> None:
        for key, value in (("rank", f"rank      : {root.rank} (local_rank: {root.local_rank})"),
                           ("exitcode", f"exitcode  : {root.exitcode}" + (f" (pid: {root.pid})" if root.pid else "")),
                           ("traceback", f"traceback : {root.traceback}")):
            if key in root.where:
                f.add(f"{root.where[key]}: {value}")

    def _who_killed(self, root: crashes.TorchrunFailure) -> str:
        said = []
        if self.oom_kills:
            said.append(f"Slurm's cgroup OOM kill ({self.oom_kills[0][0]}): host memory")
        if self.kernel_oom:
            said.append(f"the kernel's OOM killer ({self.kernel_oom[0]}): host memory")
        for where, _, _, _, _, reason in self.cancels:
            said.append(f"Slurm's cancel {('due to ' + reason.lower()) if reason else '(scancel)'} ({where})")
        if said:
            return "who killed it, as the log shows: " + "; ".join(said[:3])
        host = root.host or "the rank's host"
        return (f"the log does not show who killed it: look at `dmesg -T | grep -i -E 'killed process|out of memory'` "
                f"on {host} (the OOM killer) and at the Slurm step messages / `sacct -j JOB --format=JobID,State,"
                f"MaxRSS,ReqMem` (a cancel or the cgroup's memory limit)")

    def _rank_error(self, root: crashes.TorchrunFailure) -> list[str]:
        out = []
        errors = self.ranks.get(root.rank) or (self.ranks.get(root.local_rank) if _one_host(self.summary) else None)
        if errors and (errors.traceback or errors.error):
            out.append(f"rank {root.rank}'s traceback: " + "; ".join(
                x for x in (f"starts at {errors.traceback}" if errors.traceback else "", f"error {errors.error}"
                            if errors.error else "") if x))
        if root.error_file and root.error_file != "<N/A>":
            out.append(f"rank {root.rank}'s error file (torch.distributed.elastic's @record): {root.error_file}")
        if not out:
            out.append(f"no traceback of rank {root.rank} in the logs: it exited with code {root.exitcode} without "
                       "printing one (sys.exit), or its output is elsewhere (torchrun --log-dir / --tee 3 keeps each "
                       "rank's stderr; @record writes an error_file)")
        own = [(r, e) for r, e in self._own_errors() if r != root.rank]
        if errors and errors.error and _waited(errors.error) and own:
            out.append(f"rank {root.rank}'s error follows from another rank (a lost peer, or a timeout waiting for "
                       "one); the rank(s) that raised an error of their own, the likely first failure: "
                       + "; ".join(f"rank {r}: {e}" for r, e in own[:3])
                       + " - torchrun's Root Cause is the first exit it observed, not necessarily the first failure")
            return out
        later = sorted((r for r, e in self.ranks.items() if r != root.rank and e.error), key=_int)
        if later:
            shown = "; ".join(f"rank {r}: {self.ranks[r].error}" for r in later[:3])
            out.append(f"other ranks' errors, most likely consequences of rank {root.rank}'s exit: {shown}")
        return out

    def _own_errors(self) -> list[tuple[str, str]]:
        """(rank, 'where: error') of the ranks whose last error is their own: not a lost peer, not a timeout waiting
        for one."""
        return sorted(((r, e.error) for r, e in self.ranks.items() if e.error and not _waited(e.error)),
                      key=lambda x: _int(x[0]))

    def _first_failure(self, findings: dict[str, Finding]) -> None:
        """A lost peer or a timeout is the consequence of another rank: name the ranks that raised an error of
        their own (the likely first failure), and of a timeout the ranks that waited and the ones seen not waiting."""
        own = self._own_errors()
        waited = sorted((r for r, e in self.ranks.items() if e.error and _waited(e.error)), key=_int)
        for sig_id in _CONSEQUENCES:
            f = findings.get(sig_id)
            if f is None:
                continue
            if own:
                f.detail.append("rank(s) that raised an error of their own, the likely first failure (the others' "
                                "lost connections and timeouts follow from it): "
                                + "; ".join(f"rank {r}: {e}" for r, e in own[:3]))
            if sig_id != "nccl-remote-error" and waited:
                seen = self.seen_ranks | {x.rank for x in self.summary.failures if x.rank}
                quiet = sorted(seen - set(waited) - {r for r, _ in own}, key=_int)
                f.detail.append(f"rank(s) that timed out waiting: {', '.join(waited[:16])}" + (
                    f"; rank(s) in the logs without a timeout or an error of their own: {', '.join(quiet[:16])} - "
                    "the likely ones that did not reach the call (their stacks at that time show where they were)"
                    if quiet else ""))

    def _time_limit(self, findings: dict[str, Finding], series: IterationSeries) -> None:
        f = findings.get("slurm-time-limit")
        limits = [c for c in self.cancels if c[5].startswith("TIME LIMIT")]
        if f is None or not limits:
            return
        where, _, job, node, at, _ = limits[0]
        if not len(series):
            f.detail.append(f"no iteration line was logged before the cancel ({where}): the job never reached its first "
                            "logged iteration (initialisation, data or checkpoint loading took the time, or hung there)")
            return
        last, ms = series.numbers[-1], [x for x in series.steady_ms(min(2, len(series) - 1)) if math.isfinite(x)]
        mean_ms = statistics.fmean(ms) if ms else math.nan
        stamp, cancel = series.stamps[-1], _slurm_time(at)
        pace = f"mean step time {mean_ms:.1f} ms over {len(ms)} logged iteration(s)"
        if math.isnan(stamp) or cancel is None:
            f.detail.append(f"the last iteration seen is {last}; {pace}; whether iterations were still completing at "
                            "the cancel is not in the evidence (the iteration lines or the cancel carry no time)")
            return
        stamps = [s for s in series.stamps if math.isfinite(s)]
        gaps = [b - a for a, b in zip(stamps, stamps[1:]) if b >= a]
        interval = statistics.median(gaps) if gaps else (mean_ms / 1000 if math.isfinite(mean_ms) else 0.0)
        gap = cancel - stamp
        seen = f"the last iteration seen is {last} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(stamp))}"
        if gap <= 3 * interval + STEADY_SLACK_S:
            steady = findings.setdefault("slurm-time-limit-too-short", Finding(_SIG["slurm-time-limit-too-short"]))
            for line in f.evidence:
                steady.add(line)
            steady.detail.append(f"iterations were still completing at a steady pace until the cancel: {seen}, {gap:.0f} s "
                                 f"before it (one logged every {interval:.0f} s); {pace}")
            if series.total > last and math.isfinite(mean_ms):
                left = (series.total - last) * mean_ms / 1000
                steady.detail.append(f"the remaining {series.total - last} of {series.total} iterations need about "
                                     f"{left / 3600:.1f} h more at that pace")
            del findings["slurm-time-limit"]
            return
        f.detail.append(f"iterations had stopped before the cancel: {seen}, {gap:.0f} s before it, while one was "
                        f"logged every {interval:.0f} s ({pace}): something stopped or hung first - the other findings "
                        "say what")

    def _slurm(self, findings: dict[str, Finding]) -> None:
        if f := findings.get("slurm-oom-kill"):
            jobs = sorted({j for _, j in self.oom_kills if j} | {c[2].split(".")[0] for c in self.cancels})
            job = jobs[0] if jobs else "JOB"
            f.detail.append(f"host memory, not GPU memory: `sacct -j {job} --format=JobID,MaxRSS,ReqMem` shows each "
                            "step's peak resident memory against what was asked")
            killed = [r for r in self.summary.roots() if r.exitcode == -9]
            if killed:
                f.detail.append(f"torchrun's root cause, rank {killed[0].rank} on {killed[0].host or '?'} with SIGKILL "
                                f"({killed[0].where.get('exitcode', '?')}), is most likely this kill")
        if (f := findings.get("slurm-task-exit-code")) and self.task_exits:
            f.detail.append("; ".join(f"node {n}: task(s) {t} exited with {c} ({w})" for w, n, t, c in self.task_exits[:4]))
        if (f := findings.get("slurm-node-failure")) and self.node_failures:
            f.detail.append("node(s) lost: " + ", ".join(sorted({n for _, n in self.node_failures})))

    def _store(self, findings: dict[str, Finding]) -> None:
        if (f := findings.get("c10d-store-port-in-use")) and self.binds:
            ports = sorted({p for _, p in self.binds if p})
            f.detail.append(f"port(s) {', '.join(ports)} already in use on the node hosting the store")
        if (f := findings.get("c10d-store-connect-timeout")) and self.connects:
            for host, port in sorted({(h, p) for _, _, h, p in self.connects})[:3]:
                after = next(a for _, a, h, p in self.connects if (h, p) == (host, port))
                if host in self.unresolved:
                    f.detail.append(f"({host}, {port}): the host name does not resolve here (gai error: "
                                    f"{self.unresolved[host]}): MASTER_ADDR is wrong")
                else:
                    f.detail.append(f"({host}, {port}): nothing accepted within {after}: the store there was not "
                                    "listening yet or any more (rank 0's node started later or failed first), or the "
                                    "address / port is wrong or blocked")
        if (f := findings.get("c10d-store-connection-lost")) and self.lost:
            remotes = sorted({r for _, r, _ in self.lost if r})
            errors = sorted({e for _, _, e in self.lost})
            f.detail.append(f"store connection lost ({'; '.join(errors)})" + (f" to {', '.join(remotes[:3])}" if remotes
                                                                              else "") + ": the process hosting the "
                            "store exited first")
            roots = self.summary.roots()
            if roots and roots[0].signal not in ("SIGTERM", "SIGINT", "SIGHUP"):
                f.detail.append(f"torchrun names rank {roots[0].rank} (exit code {roots[0].exitcode}) the first failure")


_SIG = {s.id: s for s in all_signatures() if s.found_by == "launcher"}
_BY_ID = {s.id: s for s in all_signatures()}
_CONSEQUENCES = ("nccl-remote-error", "gloo-operation-timeout", "nccl-watchdog-timeout")
"""Findings that are another rank's consequence: a lost peer, a timeout waiting for a peer."""


def _keep(records: list, record) -> None:
    if len(records) < MAX_RECORDS and record not in records:
        records.append(record)


def _waited(error: str) -> bool:
    """Whether a rank's error says it lost a peer or timed out waiting for one: a consequence of another rank."""
    return peer_lost(error) or any(p.search(error) for sig_id in _CONSEQUENCES if sig_id in _BY_ID
                                   for p in _BY_ID[sig_id].compiled())


def _int(rank: str) -> int:
    return int(rank) if rank.isdigit() else 1 << 30


def _one_host(summary: crashes.TorchrunSummary) -> bool:
    return len({f.host for f in summary.failures}) <= 1


def _slurm_time(text: str) -> float | None:
    """Slurm's ``2026-12-03T04:00:12`` (its default time format, local time) as epoch seconds."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None
