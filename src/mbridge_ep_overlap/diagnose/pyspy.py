"""py-spy dumps of a stuck job: where each process waits, and which process is not where the others are.

Contract
--------
``PySpyDumps.feed(text, where)`` is fed every line of a log. It reads what ``py-spy dump --pid PID`` prints
(py-spy's ``src/dump.rs``): ``Process PID: COMMAND LINE``, ``Python vX.Y.Z (EXE)``, then per thread
``Thread TID (active|idle|active+gil): "NAME"`` (or without the name, or with ``(gil)``) and its frames,
innermost first, ``    FUNCTION (FILE:LINE)`` (``    FUNCTION (FILE)`` for a native frame). A ``Thread`` block
before any ``Process`` line (a pasted dump without its header) counts as a process of its own. Per process the
main thread is the one named ``MainThread``, else the first one. ``findings()`` returns, when at least one
process's main thread was read, one finding: for each process (its rank from ``--local-rank`` / ``--local_rank``
/ ``RANK=`` on the command line when there, else its pid), the call it waits in (the innermost frame that is a
collective, a stream / event synchronisation, or a dispatcher call) and that place in the vocabulary of EP
overlap (``schedule.place``). The processes that diverged are named: when some wait in such a call and others in
none, the others (a collective waits for them); else, when most wait in one call, the ones waiting in another.
Never raises for the text; at most ``MAX_PROCESSES`` processes and ``MAX_FRAMES`` frames each.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import schedule
from .report import Finding
from .signatures import Signature, all_signatures

_PREFIX = re.compile(r"^(?:\[(?:default|rank)\d+\]:)*")
_PROCESS = re.compile(r"^Process (\d+): (.*)$")
_THREAD = re.compile(r'^Thread (\S+)(?: \((active\+gil|active|idle|gil)\))?(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^\s{4}(\S.*?) \(([^()]+?)(?::(\d+))?\)\s*$")
_RANK_ARG = re.compile(r"(?:--local[-_]rank[= ]|\bRANK=|--node[-_]rank[= ])(\d+)")
FORMATS = ('"Process {}: {}"', '"Thread {}{}: \\"{}\\""', '"Thread {}{}"', '" ({})"', '"    {} ({}:{})"', '"    {} ({})"',
           '"idle"', '"active+gil"', '"active"')
"""The format strings of py-spy's dump this reader reads (as they stand in its Rust source; the parity test finds
each in the excerpt of that source and renders them into lines the reader must read)."""
MAX_PROCESSES = 256
MAX_FRAMES = 64

_WAITS = {
    "all_to_all_single": "all_to_all_single", "all_to_all": "all_to_all", "all_reduce": "all_reduce",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather_into_tensor",
    "_all_gather_base": "all_gather", "reduce_scatter_tensor": "reduce_scatter_tensor",
    "_reduce_scatter_base": "reduce_scatter", "barrier": "barrier", "broadcast": "broadcast",
    "all_gather_object": "all_gather_object", "broadcast_object_list": "broadcast_object_list",
    "send": "send", "recv": "recv", "isend": "isend", "irecv": "irecv", "batch_isend_irecv": "batch_isend_irecv",
    "synchronize": "a CUDA synchronize", "wait": "a wait on a collective or event",
    "get_dispatch_layout": "DeepEP get_dispatch_layout", "dispatch": "a dispatch", "combine": "a combine",
}
"""Innermost-frame function names that wait for other ranks or for the GPU, and how they are said."""


@dataclass
class Process:
    pid: str
    command: str = ""
    where: str = ""
    threads: list[tuple[str, list[tuple[str, str, int]]]] = field(default_factory=list)
    """(thread name, frames innermost first as (function, file, line; 0 for a native frame))."""

    known_rank: str = ""
    """The rank the run's facts files record for this pid, when the dumps come with them."""

    @property
    def rank(self) -> str:
        if self.known_rank:
            return f"rank {self.known_rank}"
        m = _RANK_ARG.search(self.command)
        return f"rank {m.group(1)}" if m else f"pid {self.pid}"

    def main(self) -> list[tuple[str, str, int]]:
        named = [frames for name, frames in self.threads if name == "MainThread"]
        return named[0] if named else (self.threads[0][1] if self.threads else [])


def _wait(frames: list[tuple[str, str, int]]) -> tuple[str, str] | None:
    """(what it waits in, 'function (file:line)') for the innermost waiting frame of Python code."""
    for func, file, line in frames:
        name = func.rsplit(".", 1)[-1]  # py-spy prints methods as Class.method, closures as f.<locals>.g
        if name in _GENERIC_WAITS and _standard_library(file):
            continue  # a thread's or queue's wait (a data loader) is no collective
        if name in _WAITS and (line or file.endswith(".py")):
            return _WAITS[name], f"{func} ({Path(file).name}:{line})"
    return None


_GENERIC_WAITS = {"wait", "synchronize", "send", "recv", "dispatch", "combine"}


def _standard_library(file: str) -> bool:
    """A file of Python's own library as py-spy prints it (``threading.py``, ``multiprocessing/connection.py``)."""
    path = file.replace("\\", "/")
    if "site-packages/" in path or "dist-packages/" in path:
        return False
    return path.split("/")[0].removesuffix(".py") in sys.stdlib_module_names


class PySpyDumps:
    def __init__(self) -> None:
        self.processes: list[Process] = []
        self._frames: list[tuple[str, str, int]] | None = None

    def feed(self, text: str, where: str) -> None:
        body = _PREFIX.sub("", text, count=1).rstrip("\n")
        if self._frames is not None:
            if m := _FRAME.match(body):
                if len(self._frames) < MAX_FRAMES:
                    self._frames.append((m.group(1), m.group(2), int(m.group(3) or 0)))
                return
            if body.startswith("        "):  # py-spy's --locals lines under a frame
                return
            self._frames = None
        if body.startswith("Process ") and (m := _PROCESS.match(body)):
            if len(self.processes) < MAX_PROCESSES:
                self.processes.append(Process(m.group(1), m.group(2)[:500], where))
        elif body.startswith("Thread ") and (m := _THREAD.match(body)) and (m.group(2) or m.group(3)):
            if not self.processes:
                self.processes.append(Process("?", "", where))
            proc = self.processes[-1]
            self._frames = []
            proc.threads.append((m.group(3) or "", self._frames))


PY_SPY = next(s for s in all_signatures() if s.id == "py-spy-stacks")


def findings(dumps: PySpyDumps, facts: dict[str, dict] | None = None) -> list[Finding]:
    """The finding (module docstring); ``facts``: the run's facts per rank (``base.run_files``), whose pids
    name each dumped process's rank."""
    procs = [p for p in dumps.processes if p.main()]
    if not procs:
        return []
    by_pid = {str(f.get("pid")): str(f.get("rank", r)) for r, f in (facts or {}).items()
              if isinstance(f, dict) and f.get("pid") is not None}
    for p in procs:
        p.known_rank = by_pid.get(p.pid, "")
    waits = {id(p): _wait(p.main()) for p in procs}
    waiting = Counter(w[0] for w in waits.values() if w).most_common()
    usual, odd = None, []
    if waiting and len(waiting) < len(procs) and any(not w for w in waits.values()):
        usual = waiting[0][0]  # some wait in a call that needs the others, some are in none: those hold them up
        odd = [p for p in procs if not waits[id(p)]]
    elif len(waiting) > 1 and waiting[0][1] > waiting[1][1]:
        usual = waiting[0][0]
        odd = [p for p in procs if waits[id(p)] and waits[id(p)][0] != usual]
    sig: Signature = PY_SPY
    if len(waiting) > 1 and not odd:  # different calls, no majority: which side is out of step is not known
        each = "; ".join(f"{', '.join(p.rank for p in procs if waits[id(p)] and waits[id(p)][0] == call)} in {call}"
                         for call, _ in waiting)
        sig = dataclasses.replace(sig, cause=(
            f"py-spy's dumps show the processes waiting in different calls ({each}), as many in each: the ranks' "
            f"collectives went out of step (one side skipped or added a call), and no majority says which side; the "
            f"flight recorder's sequence numbers show the first call they disagree on."))
    if odd:
        names = ", ".join(p.rank for p in odd)
        held = ", ".join(p.rank for p in procs if p not in odd and waits[id(p)] and waits[id(p)][0] == usual)
        sig = dataclasses.replace(sig, confidence=0.55, generic=False, cause=(
            f"py-spy's dumps show the processes waiting in different places: {held} "
            f"{'waits' if ',' not in held else 'wait'} in {usual}, while {names} "
            f"{'is' if len(odd) == 1 else 'are'} elsewhere (below). A collective completes only when every rank of "
            f"its group enters it, so the process(es) not in it are where the ranks diverged: a skipped or extra call, "
            f"a rank still computing (a straggler), or one stuck in a kernel or the data loader."))
    f = Finding(sig)
    for p in procs:
        w = waits[id(p)]
        f.add(f"{p.where}: {p.rank}: " + (f"waits in {w[0]} at {w[1]}" if w else "not in a collective or a wait"))
        place = schedule.place(p.main())
        user = [fr for fr in p.main() if fr[2] and "/torch/" not in fr[1] and not fr[1].startswith("torch/")]
        f.detail.append(f"{p.rank} ({p.where}): " + (f"waits in {w[0]} at {w[1]}; " if w else "")
                        + place.words() + ("; innermost frames: " + ", ".join(
                            f"{fn} ({Path(file).name}:{line})" for fn, file, line in user[:4]) if user else ""))
    return [f]
