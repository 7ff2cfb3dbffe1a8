"""Out-of-memory lines read for their numbers: what was asked, what was free, what PyTorch held.

Contract
--------
``OutOfMemory.feed(text, where)`` keeps the numbers of each distinct CUDA out-of-memory message (the
allocator's format, ``signatures.memory.OOM_PIECES``): the GPU, the allocation tried, the total capacity
and free memory, what PyTorch allocated and what it holds reserved but unallocated. ``details(findings)``
adds to the ``cuda-out-of-memory`` finding one line per message and a verdict: fragmentation (reserved but
unallocated at least the allocation tried: ``expandable_segments`` first) or memory really in use (the
configuration needs less). Reads nothing but the lines; never raises for them.
"""

from __future__ import annotations

import re

from .report import Finding

MAX_RECORDS = 8
_SIZE = r"(\d+(?:\.\d+)?) ([KMGT]i?B)"
_OOM = re.compile(r"Tried to allocate " + _SIZE + r"\. GPU (\d+) has a total capacity of " + _SIZE + r" of which "
                  + _SIZE + r" is free\.(?:.*?Of the allocated memory " + _SIZE + r" is allocated by PyTorch, and "
                  + _SIZE + r" is reserved by PyTorch but unallocated)?")
_UNIT = {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40, "KB": 2 ** 10, "MB": 2 ** 20, "GB": 2 ** 30,
         "TB": 2 ** 40}


def _bytes(number: str | None, unit: str | None) -> float | None:
    return float(number) * _UNIT[unit] if number and unit in _UNIT else None


class OutOfMemory:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict]] = []

    def feed(self, text: str, where: str) -> None:
        if "Tried to allocate" not in text or len(self.records) >= MAX_RECORDS or not (m := _OOM.search(text)):
            return
        g = m.groups()
        record = {"gpu": g[2], "tried": (g[0], g[1]), "total": (g[3], g[4]), "free": (g[5], g[6]),
                  "allocated": (g[7], g[8]), "reserved_unallocated": (g[9], g[10])}
        if all(r != record for _, r in self.records):
            self.records.append((where, record))

    def details(self, findings: dict[str, Finding]) -> None:
        f = findings.get("cuda-out-of-memory")
        if f is None:
            return
        for where, r in self.records:
            shown = lambda key: " ".join(r[key]) if r[key][0] else "?"  # noqa: E731
            line = (f"GPU {r['gpu']}: tried to allocate {shown('tried')}, {shown('free')} free of {shown('total')}; "
                    f"PyTorch allocated {shown('allocated')}, reserved but unallocated {shown('reserved_unallocated')}")
            tried, spare = _bytes(*r["tried"]), _bytes(*r["reserved_unallocated"])
            if spare is None:
                verdict = "the message does not say how much PyTorch holds reserved but unallocated"
            elif spare >= tried:
                verdict = ("fragmentation: PyTorch holds more reserved but unallocated memory than the allocation "
                           "asked for; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True first")
            else:
                verdict = "memory really in use: the configuration needs less memory per rank (see the fix)"
            f.detail.append(f"{line} ({where}): {verdict}")
