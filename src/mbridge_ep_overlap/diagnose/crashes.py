"""Crash and faulthandler readers over a run's logs: which rank died of which signal, and its stack.

Contract
--------
``rank_texts(logs)`` maps torchrun's per-rank ``attempt_N/R/std{out,err}.log`` files (or, without
them, torchrun's ``[defaultN]:`` prefixed lines) to rank -> text. ``faulthandler_stack(text)`` returns
the frames of the crashing thread's block faulthandler printed; ``main_thread_stack(text)`` the block
of the thread that runs training (the process's main thread, listed last by faulthandler), never the
watchdog thread that wrote the dump. ``rank_crashes(logs)`` lists every rank that died of a signal
(faulthandler's "Fatal Python error: ..." or torchrun's "exitcode : -11"), the rank that crashed by
itself first; ``crash_report`` says it in one paragraph. ``TorchrunSummary`` reads torchrun's failure summary
(``ChildFailedError``: the "Failures:" and "Root Cause (first observed failure):" blocks) a line at a time into
``TorchrunFailure`` records (rank, local rank, host, exit code, pid, error file, traceback line, whether it is the
root cause, the file:line of each field); ``torchrun_failures(text)`` runs it over a text, and the exit codes
``rank_crashes`` uses come from it. Pure text in, data out: no file access, no torch. The launcher
(``lab.launch``) and ``diagnose`` both read crashes through this module.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path

_SIGNALS = {int(s): s.name for s in signal.Signals}
# faulthandler's "Fatal Python error: <what>" for the signals it handles, as signal names.
FATAL_ERRORS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE",
                "Illegal instruction": "SIGILL"}
# Signals a rank dies of on its own; SIGTERM / SIGKILL are what torchrun (or our timeout) sends the others.
SELF_INFLICTED = {"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"}

@dataclass
class RankCrash:
    """One rank that died of a signal: which, and the Python frames faulthandler printed."""

    rank: str
    signal: str
    stack: list[str] = field(default_factory=list)
    """faulthandler's frames of the crashing thread, innermost first ('File "...", line N in f')."""
    log: str = ""

    def where(self) -> str:
        m = re.match(r'File "([^"]+)", line (\d+) in (\S+)', self.stack[0]) if self.stack else None
        return f" at {Path(m.group(1)).name}:{m.group(2)} in {m.group(3)}" if m else ""


_RANK_DIR = re.compile(r"(?:^|/)attempt_\d+/(\d+)/(stdout|stderr)\.log$")
_PREFIX = re.compile(r"^\[(?:default|rank)(\d+)\]:", re.M)


def rank_texts(logs: dict[str, str]) -> dict[str, str]:
    """rank -> everything that rank wrote (stdout then stderr), from torchrun's per-rank files
    (``<log-dir>/<run>/attempt_N/<local rank>/std{out,err}.log``); without them, from the
    ``[defaultN]:`` prefixed lines torchrun tees into its own output."""
    out: dict[str, list[str]] = {}
    for name in sorted(logs, key=lambda n: (n.endswith("stderr.log"), n)):
        m = _RANK_DIR.search(name.replace(os.sep, "/"))
        if m:
            out.setdefault(m.group(1), []).append(logs[name])
    if out:
        return {rank: "\n".join(parts) for rank, parts in sorted(out.items(), key=lambda kv: int(kv[0]))}
    lines: dict[str, list[str]] = {}
    for text in logs.values():
        for line in text.splitlines():
            m = _PREFIX.match(line)
            if m:
                lines.setdefault(m.group(1), []).append(line[m.end():])
    return {rank: "\n".join(v) for rank, v in sorted(lines.items(), key=lambda kv: int(kv[0]))}


def faulthandler_stack(text: str, start: int = 0) -> list[str]:
    """The frames of the crashing thread's block faulthandler printed after ``start`` ("Current
    thread ..." with all threads dumped, "Stack ..." with one; else the first "Thread ..." block)."""
    frames = r"[^\n]*\(most recent call first\):\n((?:[ \t]+[^\n]*\n?)*)"
    block = (re.search(rf"^(?:Current thread|Stack){frames}", text[start:], re.M)
             or re.search(rf"^Thread{frames}", text[start:], re.M))
    if not block:
        return []
    return [line.strip() for line in block.group(1).splitlines() if line.strip().startswith("File ")]


@dataclass
class TorchrunFailure:
    """One block of torchrun's failure summary (torch's ``_FAILURE_FORMAT_TEMPLATE``)."""

    rank: str
    local_rank: str = ""
    exitcode: int | None = None
    pid: str = ""
    host: str = ""
    time: str = ""
    error_file: str = ""
    traceback: str = ""
    """The block's first ``traceback :`` line: "Signal 9 (SIGKILL) received by PID 716", torch's pointer to the
    elastic errors page (no error file), or the first line of the error file's traceback."""
    root: bool = False
    """In the "Root Cause (first observed failure):" section."""
    where: dict[str, str] = field(default_factory=dict)
    """field name -> file:line it was read from."""

    @property
    def signal(self) -> str | None:
        """The signal's name for a negative exit code, else None."""
        if self.exitcode is None or self.exitcode >= 0:
            return None
        return _SIGNALS.get(-self.exitcode, f"signal {-self.exitcode}")


# "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 716)" (newer torch adds " (SIGKILL)"), ...
_FIELD = re.compile(r"^\s{0,4}(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_LINE_PREFIX = re.compile(r"^(?:\s*\d+: )?(?:\[(?:default|rank)\d+\]:\s?)?")
_RANK_VALUE = re.compile(r"(\d+)(?: \(local_rank: (\d+)\))?")
_EXIT_VALUE = re.compile(r"(-?\d+)(?: \(pid: (\d+)\))?")
ROOT_CAUSE = "Root Cause (first observed failure):"
"""torch's heading of the first observed failure (``_MSG_FORMAT_TEMPLATE``)."""
MAX_FAILURES = 512


class TorchrunSummary:
    """torchrun's failure summaries read a line at a time (several: one per node's agent, or per restart)."""

    def __init__(self) -> None:
        self.failures: list[TorchrunFailure] = []
        self._section: str | None = None  # "root", "other" or None (outside a summary)
        self._current: TorchrunFailure | None = None
        self._pending: dict[str, str] = {}  # the block's time / host, printed before its rank line
        self._pending_where: dict[str, str] = {}

    def feed(self, line: str, where: str = "") -> None:
        text = _LINE_PREFIX.sub("", line, count=1).rstrip()
        if not text:
            return
        if text.startswith(ROOT_CAUSE):
            self._section, self._current = "root", None
            return
        if text.startswith("Failures:"):
            self._section, self._current = "other", None
            return
        if re.fullmatch(r"=+", text):
            self._section, self._current = None, None
            return
        m = _FIELD.match(text)
        if not m:
            return
        key, value = m.group(1), m.group(2).strip()
        if key == "rank":
            if not (v := _RANK_VALUE.match(value)) or len(self.failures) >= MAX_FAILURES:
                self._current = None
                return
            self._current = TorchrunFailure(v.group(1), v.group(2) or "", root=self._section == "root")
            self._current.where["rank"] = where
            self._current.host, self._current.time = self._pending.get("host", ""), self._pending.get("time", "")
            self._current.where.update(self._pending_where)
            self._pending, self._pending_where = {}, {}
            self.failures.append(self._current)
            return
        if key in ("time", "host"):  # printed before the rank line of their block, inside a summary only
            if self._section is None:
                return
            if key == "time":
                self._pending, self._pending_where = {}, {}
            self._pending[key], self._pending_where[key] = value, where
            return
        f = self._current
        if f is None or key in f.where:
            return
        f.where[key] = where
        if key == "exitcode" and (v := _EXIT_VALUE.match(value)):
            f.exitcode, f.pid = int(v.group(1)), v.group(2) or ""
        elif key == "error_file":
            f.error_file = value
        elif key == "traceback":
            f.traceback = value[:300]

    def roots(self) -> list[TorchrunFailure]:
        """The root-cause blocks, a rank that failed by itself first (an exit code above 0, a signal it raised, or
        SIGKILL from outside) before ranks torchrun terminated (SIGTERM / SIGINT / SIGHUP), then in log order."""
        roots = [f for f in self.failures if f.root and f.exitcode is not None]
        return sorted(roots, key=lambda f: f.signal in _TERMINATED)


_TERMINATED = ("SIGTERM", "SIGINT", "SIGHUP")


def torchrun_failures(text: str) -> list[TorchrunFailure]:
    """Every block of torchrun's failure summaries in ``text``."""
    summary = TorchrunSummary()
    for number, line in enumerate(text.splitlines(), 1):
        summary.feed(line, str(number))
    return summary.failures


def _torchrun_exitcodes(text: str) -> dict[str, int]:
    """rank -> exit code from torchrun's failure summary ("rank : 0 (local_rank: 0)" / "exitcode : -11")."""
    return {f.rank: f.exitcode for f in torchrun_failures(text) if f.exitcode is not None}


def rank_crashes(logs: dict[str, str]) -> list[RankCrash]:
    """Every rank that died of a signal, the rank that crashed first by itself listed first:
    faulthandler's report in the rank's own output, else torchrun's exit code. Ranks torchrun (or a
    timeout) terminated afterwards (SIGTERM, SIGKILL) come last."""
    found: dict[str, RankCrash] = {}
    for rank, text in rank_texts(logs).items():
        m = re.search(r"^Fatal Python error: ([^\n]+?)\s*$", text, re.M)
        if m:
            what = m.group(1)
            name = next((sig for msg, sig in FATAL_ERRORS.items() if what.startswith(msg)), what)
            found[rank] = RankCrash(rank, name, faulthandler_stack(text, m.end()))
    for text in logs.values():
        for rank, code in _torchrun_exitcodes(text).items():
            if code < 0 and rank not in found:
                found[rank] = RankCrash(rank, _SIGNALS.get(-code, f"signal {-code}"))
    return sorted(found.values(), key=lambda c: (c.signal not in SELF_INFLICTED, not c.stack, int(c.rank)))


def crash_report(crashes: list[RankCrash], frames: int = 12) -> str:
    """'crashed (SIGSEGV) in rank 0 at x.py:3 in f' plus each crashed rank's faulthandler frames."""
    if not crashes:
        return ""
    first = crashes[0]
    lines = [f"crashed ({first.signal}) in rank {first.rank}{first.where()}"
             + "".join(f"; rank {c.rank}: {c.signal}" for c in crashes[1:])]
    for c in crashes:
        if c.stack:
            lines.append(f"  Python stack of rank {c.rank} (faulthandler, most recent call first):")
            lines += [f"    {frame}" for frame in c.stack[:frames]]
    return "\n".join(lines)


_BLOCK = re.compile(r"^(Current thread|Thread|Stack) [^\n]*\(most recent call first\):\s*$")


def thread_dumps(text: str) -> list[list[list[str]]]:
    """Each faulthandler dump in ``text`` (blocks separated by blank lines only), as its thread blocks'
    frames, in the order faulthandler printed them."""
    dumps: list[list[list[str]]] = []
    block: list[str] | None = None
    gap = True  # only blank lines since the last block: the next block belongs to the same dump
    for line in text.splitlines():
        if _BLOCK.match(line):
            if block is None and not gap or not dumps:
                dumps.append([])
            block = []
            dumps[-1].append(block)
            gap = True
        elif block is not None and line.startswith((" ", "\t")):
            if line.strip().startswith("File "):
                block.append(line.strip())
        elif not line.strip():
            block = None
        else:
            block, gap = None, False
    return dumps


def main_thread_stack(text: str) -> list[str]:
    """The training (main) thread's frames in the first all-threads dump of ``text``: faulthandler lists
    threads newest first, so the main thread is the dump's last block - not the "Current thread",
    which in a watchdog dump is the watchdog's own."""
    for dump in thread_dumps(text):
        blocks = [b for b in dump if b]
        if blocks:
            return blocks[-1]
    return []
