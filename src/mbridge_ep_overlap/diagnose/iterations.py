"""MB's iteration lines, read as a stream: the one numerics reader ``verify-log`` and ``diagnose`` share.

Contract
--------
``IterationSeries.feed(line, where)`` reads one log line (torchrun / srun prefixes already stripped
or not: the iteration head is searched anywhere in the line). A line is an iteration line when it has
MB's ``iteration N/ M |`` head and ``elapsed time per iteration (ms): X``; the other fields (``lm loss``,
``grad norm``, the skipped and NaN counters) are read when present - MB leaves ``lm loss`` out of the
line when its average is not >= 0, i.e. when it is NaN. The first line for an iteration number wins
(a torchrun tee and a per-rank file of the same run repeat each other).

MB starts the line with the wall-clock time it was logged at (``[%Y-%m-%d %H:%M:%S]``): kept as seconds since the
epoch (``stamps``, NaN where a line has none); ``total`` is the last ``train_iters`` a head named (0 before any).

Memory: per iteration, seven numbers in ``array`` columns (56 bytes), whatever the size of the log; the
anomalies are found while reading, against a window of the last ``WINDOW`` values, and keep the
file:line they were read from.

Anomalies (``Anomaly.kind``, the signature id of ``signatures.numerics`` they raise):

* ``non-finite-loss``: a loss that is NaN/Inf or not a number, or missing while MB counted a NaN iteration;
* ``nan-iterations``: MB's "number of nan iterations" above 0;
* ``skipped-iterations``: "number of skipped iterations" above 0 (loss-scale skips; no signature);
* ``grad-norm-blowup``: a grad norm that is not finite, or above ``GRAD_NORM_BLOWUP`` times the median of
  the window (``GRAD_NORM_ABSOLUTE`` when fewer than ``MIN_HISTORY`` earlier values exist);
* ``loss-spike``: a loss above ``LOSS_SPIKE`` times the median of the window (``MIN_HISTORY`` values needed).
"""

from __future__ import annotations

import bisect
import math
import time
import re
import statistics
from array import array
from collections import deque
from dataclasses import dataclass, field

WINDOW = 20
MIN_HISTORY = 3
GRAD_NORM_BLOWUP = 100.0
GRAD_NORM_ABSOLUTE = 1.0e4
LOSS_SPIKE = 1.5

_HEAD = re.compile(r"\biteration\s+([0-9]{1,18})/\s*([0-9]{1,18})\s*\|")
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]\s*$")
_MS = re.compile(r"elapsed time per iteration \(ms\):\s+([^\s|]+)")
_LOSS = re.compile(r"\blm loss:\s+([^\s|]+)")
_GRAD = re.compile(r"\bgrad norm:\s+([^\s|]+)")
_SKIPPED = re.compile(r"number of skipped iterations:\s+([0-9]{1,18})")
_NAN = re.compile(r"number of nan iterations:\s+([0-9]{1,18})")


@dataclass(frozen=True)
class Anomaly:
    kind: str
    iteration: int
    detail: str
    where: str
    """file:line the iteration line was read from."""


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan  # reported as an anomaly with the text as logged


def _stamp(before: str) -> float:
    """MB's ``[YYYY-MM-DD HH:MM:SS]`` just before the iteration head, as epoch seconds (local time); NaN without."""
    m = _STAMP.search(before)
    if not m:
        return math.nan
    try:
        return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return math.nan


@dataclass
class IterationSeries:
    numbers: array = field(default_factory=lambda: array("q"))
    ms: array = field(default_factory=lambda: array("d"))
    loss: array = field(default_factory=lambda: array("d"))
    grad_norm: array = field(default_factory=lambda: array("d"))
    skipped: array = field(default_factory=lambda: array("q"))
    nan: array = field(default_factory=lambda: array("q"))
    stamps: array = field(default_factory=lambda: array("d"))
    """When MB logged the line (seconds since the epoch, local time), NaN without a time."""
    total: int = 0
    anomalies: list[Anomaly] = field(default_factory=list)
    _losses: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    _grads: deque = field(default_factory=lambda: deque(maxlen=WINDOW))

    def __len__(self) -> int:
        return len(self.numbers)

    def feed(self, line: str, where: str = "") -> bool:
        """Read one line; True when it was a new iteration line."""
        if "iteration" not in line or not (head := _HEAD.search(line)) or not (ms := _MS.search(line)):
            return False
        iteration = int(head.group(1))
        at = bisect.bisect_left(self.numbers, iteration)
        if at < len(self.numbers) and self.numbers[at] == iteration:
            return False
        loss_m, grad_m = _LOSS.search(line), _GRAD.search(line)
        skipped_m, nan_m = _SKIPPED.search(line), _NAN.search(line)
        loss = number(loss_m.group(1)) if loss_m else math.nan
        grad = number(grad_m.group(1)) if grad_m else math.nan
        skipped = int(skipped_m.group(1)) if skipped_m else 0
        nans = int(nan_m.group(1)) if nan_m else 0
        self.total = int(head.group(2))
        stamp = _stamp(line[max(0, head.start() - 40):head.start()])
        for column, value in ((self.numbers, iteration), (self.ms, number(ms.group(1))), (self.loss, loss),
                              (self.grad_norm, grad), (self.skipped, skipped), (self.nan, nans), (self.stamps, stamp)):
            column.insert(at, value)
        self._check(iteration, loss_m.group(1) if loss_m else None, loss, grad_m, grad, skipped, nans, where)
        return True

    def _check(self, iteration, loss_text, loss, grad_m, grad, skipped, nans, where) -> None:
        add = lambda kind, detail: self.anomalies.append(Anomaly(kind, iteration, detail, where))  # noqa: E731
        if loss_text is not None and not math.isfinite(loss):
            add("non-finite-loss", f"loss {loss_text}" + (" (not a number)" if math.isnan(loss)
                                                           and loss_text.lower() != "nan" else ""))
        elif loss_text is None and nans:
            add("non-finite-loss", "no lm loss logged (MB leaves out a NaN average)")
        if nans:
            add("nan-iterations", f"{nans} NaN iterations")
        if skipped:
            add("skipped-iterations", f"{skipped} skipped iterations")
        if grad_m and not math.isfinite(grad):
            add("grad-norm-blowup", f"grad norm {grad_m.group(1)}")
        elif grad_m:
            base = statistics.median(self._grads) if len(self._grads) >= MIN_HISTORY else None
            if (base is not None and grad > GRAD_NORM_BLOWUP * max(base, 1e-12)) or (base is None and grad > GRAD_NORM_ABSOLUTE):
                add("grad-norm-blowup", f"grad norm {grad_m.group(1)}"
                    + (f" ({grad / max(base, 1e-12):.0f}x the median {base:.3g} of the iterations before)" if base
                       else f" (above {GRAD_NORM_ABSOLUTE:.0f})"))
            self._grads.append(grad)
        if loss_text is not None and math.isfinite(loss):
            if len(self._losses) >= MIN_HISTORY and loss > LOSS_SPIKE * (base := statistics.median(self._losses)) > 0:
                add("loss-spike", f"loss {loss_text} ({loss / base:.2f}x the median {base:.4g} of the iterations before)")
            self._losses.append(loss)

    def losses(self) -> dict[int, float]:
        return dict(zip(self.numbers, self.loss))

    def steady_ms(self, warmup: int) -> list[float]:
        """Elapsed times after the first ``warmup`` iteration lines, by position (a log may start at 100)."""
        return list(self.ms[warmup:])

    def problems(self) -> list[Anomaly]:
        """Anomalies that make a log unhealthy (every kind counts; none is healthy)."""
        return list(self.anomalies)
