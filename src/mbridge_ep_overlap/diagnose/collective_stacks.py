"""The Python stack of a timed-out collective, as torch's NCCL watchdog prints it into the log.

Contract
--------
``CollectiveStacks.feed(text, where)`` is fed every line of a log. torch's ``ProcessGroupNCCL`` watchdog
prints, per timed-out collective, ``[PG ID P PG GUID G(DESC) Rank R]  failure detected by watchdog at
work sequence id: S`` and then ``Stack trace of the failed collective:`` followed by ``#N FUNC from
FILE:LINE`` frames (innermost first; torch 2.6+ with ``TORCH_NCCL_TRACE_CPP_STACK`` off); the stacks
follow the failure lines in order on each rank, so each is given to the oldest failure line of that
rank still without one. ``stacks`` holds one ``CollectiveStack`` per (rank, group, sequence number),
also read when the flight-recorder dump has no frames. Never raises for the text.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

_PREFIX = re.compile(r"^(?:\[(?:default|rank)(\d+)\]:)*")
_FAILED = re.compile(r"\[PG ID \d+ PG GUID (\S+?)\(([^)]*)\) Rank (\d+)\]\s+failure detected by watchdog at work "
                     r"sequence id: (\d+)")
_CAUGHT = re.compile(r"\[Rank (\d+)\] Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), "
                     r"OpType=(\w+)")
_STACK = "Stack trace of the failed collective:"
_FRAME = re.compile(r"^#\d+ (\S+) from (.+):(\d+)\s*$")
MAX_FRAMES = 64


@dataclass
class CollectiveStack:
    rank: int
    group: str
    """The process group's GUID, as the flight recorder names it ('25')."""
    description: str
    """'EXPERT_MODEL_PARALLEL_GROUP'."""
    sequence: int
    op: str
    where: str
    frames: list[tuple[str, str, int]] = field(default_factory=list)
    """(function, file, line), innermost first."""


class CollectiveStacks:
    def __init__(self) -> None:
        self.stacks: list[CollectiveStack] = []
        self._waiting: dict[int, deque[CollectiveStack]] = {}
        self._ops: dict[tuple[int, int], str] = {}
        self._filling: CollectiveStack | None = None

    def feed(self, text: str, where: str) -> None:
        body = _PREFIX.sub("", text, count=1).strip()
        if self._filling is not None:
            if (m := _FRAME.match(body)) and len(self._filling.frames) < MAX_FRAMES:
                self._filling.frames.append((m.group(1), m.group(2), int(m.group(3))))
                return
            if not m:
                self._filling = None
        if "Watchdog caught" in body and (m := _CAUGHT.search(body)):
            self._ops[(int(m.group(1)), int(m.group(2)))] = m.group(3)
        elif "failure detected by watchdog" in body and (m := _FAILED.search(body)):
            rank, seq = int(m.group(3)), int(m.group(4))
            if not any((s.rank, s.group, s.sequence) == (rank, m.group(1), seq) for s in self.stacks):
                s = CollectiveStack(rank, m.group(1), m.group(2), seq, self._ops.get((rank, seq), ""), where)
                self.stacks.append(s)
                self._waiting.setdefault(rank, deque()).append(s)
        elif _STACK in body:
            rank_m = re.search(r"\[rank(\d+)\]", text)
            queue = self._waiting.get(int(rank_m.group(1))) if rank_m else None
            self._filling = queue.popleft() if queue else None

    def find(self, group: str, sequence: int) -> CollectiveStack | None:
        """The stack of the collective with that group GUID (or 'GUID:DESC') and sequence number."""
        guid = group.split(":", 1)[0]
        return next((s for s in self.stacks if s.group == guid and s.sequence == sequence and s.frames), None)
