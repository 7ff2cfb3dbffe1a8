"""The MB training-log reader ``verify-log`` uses (``tools.verify_log``): ``parse(LOG)`` -> ``LogReport``.

Contract
--------
A LOG is one file, or a folder: every ``*.log`` below it is one run's logs (torchrun ``--log-dir``
with a file per rank, a bench run folder). MB prints the configuration summary on rank 0 and the
iteration lines on the last rank only, so a single rank's file of a multi-rank run has one or the
other; a folder merges them. From a Megatron-Bridge training log (plain, or torchrun-prefixed
``[default0]:`` lines) it reads

* the "Configuration Summary (Non-Default Values vs Megatron Core)" block: the overlap flag,
  delayed wgrad, high-priority all-to-all stream, dispatcher type and flex backend (a field absent
  from the block has MCore's default: overlap False, dispatcher 'allgather', backend 'deepep');
* iteration lines: iteration, elapsed ms, lm loss, grad norm, skipped and NaN counters, read by the
  numerics reader ``diagnose`` uses too (``diagnose.iterations``): a NaN/Inf loss, a NaN iteration, a
  grad-norm blow-up or a loss spike makes the log unhealthy, never "finite";
* warnings that mean a silent fallback (flex -> alltoall) or a slow path
  (``CUDA_DEVICE_MAX_CONNECTIONS=1``, reported by this library's rules).

Logs are streamed line by line: memory grows with the number of iterations (48 bytes each), not
with the size of the file. An unreadable file, an empty folder or a file that is not a
Megatron-Bridge training log is one ``UsageError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..base.errors import UsageError
from ..diagnose.iterations import IterationSeries
from ..diagnose.sources import TextSource, lines

_FIELD = re.compile(r"^\s+(\w+): (.+?)\s+\(Mcore default: .*\)\s*$")
FALLBACK = re.compile(r"Falling back to alltoall")
_SLOW_CONNECTIONS = re.compile(r"cuda-device-max-connections|CUDA_DEVICE_MAX_CONNECTIONS=1\b")
_MAX_WARNINGS = 20
NO_ITERATION_LINES = "no iteration lines"
"""What ``unhealthy`` says of a log without iteration lines (``verify_log`` names the rank to add)."""
_DEFAULTS = {
    "overlap_moe_expert_parallel_comm": "False",
    "delay_wgrad_compute": "False",
    "high_priority_a2a_comm_stream": "False",
    "moe_token_dispatcher_type": "'allgather'",
    "moe_flex_dispatcher_backend": "'deepep'",
}


@dataclass
class LogReport:
    path: str
    has_summary: bool = False
    fields: dict[str, str] = field(default_factory=dict)
    series: IterationSeries = field(default_factory=IterationSeries)
    fallbacks: list[str] = field(default_factory=list)
    slow_paths: list[str] = field(default_factory=list)

    def value(self, name: str) -> str:
        return self.fields.get(name, _DEFAULTS[name]).strip("'")

    @property
    def overlap_active(self) -> bool:
        return self.value("overlap_moe_expert_parallel_comm") == "True" and self.value(
            "moe_token_dispatcher_type"
        ) in ("alltoall", "flex")

    @property
    def iterations(self) -> dict[int, dict]:
        """iteration -> its numbers (a view built on demand; the report keeps columns)."""
        s = self.series
        return {int(i): {"ms": ms, "loss": loss, "grad_norm": g, "skipped": int(sk), "nan": int(n)}
                for i, ms, loss, g, sk, n in zip(s.numbers, s.ms, s.loss, s.grad_norm, s.skipped, s.nan)}

    def losses(self) -> dict[int, float]:
        return self.series.losses()

    def steady(self, warmup: int) -> dict[int, float]:
        """iteration -> elapsed ms after the first ``warmup`` iteration lines (by position)."""
        return dict(zip(self.series.numbers[warmup:], self.series.ms[warmup:]))

    def steady_ms(self, warmup: int) -> list[float]:
        return self.series.steady_ms(warmup)

    def unhealthy(self) -> list[str]:
        if not len(self.series):
            return [NO_ITERATION_LINES]
        return [f"iteration {a.iteration}: {a.detail}" + (f" ({a.where})" if a.kind in _LOCATED else "")
                for a in self.series.problems()]


_LOCATED = ("grad-norm-blowup", "loss-spike")


def parse(path: str | Path) -> LogReport:
    p = Path(path)
    if not p.exists():
        raise UsageError("log file", str(path), "a readable file (No such file or directory)", "unreadable")
    files = sorted(p.rglob("*.log")) if p.is_dir() else [p]
    if not files:
        raise UsageError("log folder", str(path), "a folder with *.log files (torchrun --log-dir, a bench run folder)",
                         "empty")
    report = LogReport(str(path))
    for f in files:
        try:
            _read_into(report, TextSource(str(f), path=f))
        except OSError as e:
            raise UsageError("log file", str(f), f"a readable file ({e.strerror})", "unreadable") from None
    if not report.has_summary and not len(report.series):
        raise UsageError("Megatron-Bridge training log", str(path),
                         "a log with the configuration summary or iteration lines", "not a")
    return report


def _read_into(report: LogReport, source: TextSource) -> None:
    in_model_block = False
    for where, _rank, line, _raw in lines(source):
        if "Configuration Summary (Non-Default Values vs Megatron Core)" in line:
            report.has_summary = True
        if line.startswith("["):
            in_model_block = line.startswith("[model]")
        if in_model_block and (m := _FIELD.match(line)) and m.group(1) in _DEFAULTS:
            report.fields.setdefault(m.group(1), m.group(2))
        report.series.feed(line, where)
        for pattern, found in ((FALLBACK, report.fallbacks), (_SLOW_CONNECTIONS, report.slow_paths)):
            if pattern.search(line) and line.strip() not in found and len(found) < _MAX_WARNINGS:
                found.append(line.strip())
