"""Log verifier: ``mbridge-ep-overlap verify-log LOG [LOG]`` reads MB training logs as a user would.

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
* iteration lines: iteration, elapsed ms, lm loss, skipped and NaN counters;
* warnings that mean a silent fallback (flex -> alltoall) or a slow path
  (``CUDA_DEVICE_MAX_CONNECTIONS=1``, reported by this library's rules).

One log: a verdict (overlap active or not, and why), steady-window step time, loss health.
Two logs (reference first, e.g. overlap off, then on): also the speedup over the steady window
and loss parity (``numerics.compare_losses``). Exit 0 when the logs parse and the losses are
healthy and match; 1 when they do not, or when a log of the two has no iteration lines (then it
says which, and that MB prints them on the last rank); 2 for an unreadable file, an empty folder or
a file that is not a Megatron-Bridge training log (one line, no traceback).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import UsageError
from .numerics import compare_losses

_PREFIX = re.compile(r"^\[[a-z]*\d+\]:\s?")
_FIELD = re.compile(r"^\s+(\w+): (.+?)\s+\(Mcore default: .*\)\s*$")
_ITER = re.compile(
    r"iteration\s+([0-9]{1,18})/\s*[0-9]+ \|.*?elapsed time per iteration \(ms\): ([^\s|]+) \|.*?"
    r"lm loss: ([^\s|]+) \|.*?number of skipped iterations:\s+([0-9]{1,18}) \| number of nan iterations:\s+([0-9]{1,18})"
)
FALLBACK = re.compile(r"Falling back to alltoall")
SLOW_CONNECTIONS = re.compile(r"cuda-device-max-connections|CUDA_DEVICE_MAX_CONNECTIONS=1\b")
DEFAULTS = {
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
    iterations: dict[int, dict] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)
    slow_paths: list[str] = field(default_factory=list)

    def value(self, name: str) -> str:
        return self.fields.get(name, DEFAULTS[name]).strip("'")

    @property
    def overlap_active(self) -> bool:
        return self.value("overlap_moe_expert_parallel_comm") == "True" and self.value(
            "moe_token_dispatcher_type"
        ) in ("alltoall", "flex")

    def losses(self) -> dict[int, float]:
        return {i: it["loss"] for i, it in self.iterations.items()}

    def steady_ms(self, warmup: int) -> list[float]:
        return [it["ms"] for i, it in sorted(self.iterations.items()) if i > warmup]

    def unhealthy(self) -> list[str]:
        if not self.iterations:
            return [_NO_ITERATION_LINES]
        out = [f"iteration {i}: loss {it['text']}" + (" (not a number)" if math.isnan(it["loss"]) and it["text"].lower() != "nan"
                                                    else "")
               for i, it in sorted(self.iterations.items()) if not math.isfinite(it["loss"])]
        last = self.iterations[max(self.iterations)] if self.iterations else None
        if last and (last["skipped"] or last["nan"]):
            out.append(f"{last['skipped']} skipped and {last['nan']} NaN iterations")
        return out


def parse(path: str | Path) -> LogReport:
    p = Path(path)
    files = sorted(p.rglob("*.log")) if p.is_dir() else [p]
    if not files:
        raise UsageError("log folder", str(path), "a folder with *.log files (torchrun --log-dir, a bench run folder)",
                         "empty")
    report = LogReport(str(path))
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError as e:
            raise UsageError("log file", str(f), f"a readable file ({e.strerror})", "unreadable") from None
        _read_into(report, text)
    if not report.has_summary and not report.iterations:
        raise UsageError("Megatron-Bridge training log", str(path),
                         "a log with the configuration summary or iteration lines", "not a")
    return report


def _read_into(report: LogReport, text: str) -> None:
    in_model_block = False
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw)
        if "Configuration Summary (Non-Default Values vs Megatron Core)" in line:
            report.has_summary = True
        if line.startswith("["):
            in_model_block = line.startswith("[model]")
        if in_model_block and (m := _FIELD.match(line)) and m.group(1) in DEFAULTS:
            report.fields.setdefault(m.group(1), m.group(2))
        if (m := _ITER.search(line)) and int(m.group(1)) not in report.iterations:
            report.iterations[int(m.group(1))] = {
                "ms": _number(m.group(2)), "loss": _number(m.group(3)), "text": m.group(3),
                "skipped": int(m.group(4)), "nan": int(m.group(5)),
            }
        if FALLBACK.search(line) and line.strip() not in report.fallbacks:
            report.fallbacks.append(line.strip())
        if SLOW_CONNECTIONS.search(line) and line.strip() not in report.slow_paths:
            report.slow_paths.append(line.strip())


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan  # reported by unhealthy() with the text as logged


def verdict_lines(report: LogReport, warmup: int) -> list[str]:
    lines = []
    if report.has_summary:
        state = "ACTIVE" if report.overlap_active else "NOT active"
        why = (f"overlap_moe_expert_parallel_comm={report.value('overlap_moe_expert_parallel_comm')}, "
               f"dispatcher={report.value('moe_token_dispatcher_type')}")
        if report.value("moe_token_dispatcher_type") == "flex":
            why += f", backend={report.value('moe_flex_dispatcher_backend')}"
        why += f", delay_wgrad={report.value('delay_wgrad_compute')}"
        if report.value("high_priority_a2a_comm_stream") == "True":
            why += ", high-priority all-to-all stream"
        lines.append(f"EP overlap {state} ({why})")
    else:
        lines.append("EP overlap: unknown (no configuration summary in this log)")
    steady = report.steady_ms(warmup)
    if steady:
        lines.append(f"{len(report.iterations)} iterations; steady median {statistics.median(steady):.1f} ms/iteration "
                     f"(iterations after {warmup})")
    elif not report.iterations:
        lines.append(_NO_ITERATIONS)
    else:
        lines.append(f"{len(report.iterations)} iterations, none after the {warmup} warm-up iterations: no steady window")
    problems = [p for p in report.unhealthy() if p != _NO_ITERATION_LINES]
    if report.iterations:
        lines.append("losses: " + ("; ".join(problems) if problems else "finite, 0 skipped, 0 NaN"))
    else:
        lines.append("losses: not checked (no iteration lines)")
    for f in report.fallbacks:
        lines.append(f"SILENT FALLBACK: {f}")
    for s in report.slow_paths:
        lines.append(f"SLOW PATH: {s}")
    return lines


_NO_ITERATION_LINES = "no iteration lines"
_NO_ITERATIONS = (f"{_NO_ITERATION_LINES}: MB prints them on the last rank only - give that rank's log too, "
                  "or the run's log folder")


def verify(paths: list[str], warmup: int = 2) -> tuple[int, list[str]]:
    if not 1 <= len(paths) <= 2:
        raise UsageError("number of logs", len(paths), "1 (verdict) or 2 (reference, candidate)", "wrong")
    reports = [parse(p) for p in paths]
    out, code = [], 0
    for r in reports:
        out.append(f"== {r.path}")
        out += [f"  {line}" for line in verdict_lines(r, warmup)]
        code |= 1 if r.unhealthy() or r.fallbacks else 0
    if len(reports) == 2:
        ref, cand = reports
        if not (ref.iterations and cand.iterations):
            out.append(f"== {cand.path} vs {ref.path}: not compared ({_NO_ITERATION_LINES} in "
                       + " and ".join(r.path for r in reports if not r.iterations) + ")")
            return code | 1, out
        a, b = ref.steady_ms(warmup), cand.steady_ms(warmup)
        ok_times = a and b and all(math.isfinite(t) and t > 0 for t in (*a, *b))
        speed = (f"speedup {statistics.median(a) / statistics.median(b):.3f}x over the steady window" if ok_times
                 else "no steady window for a speedup" if not (a and b)
                 else "no speedup: an elapsed time in the steady window is zero or not a number")
        parity = compare_losses(ref.losses(), cand.losses())
        verdict = (f"losses match (max rel diff {parity.max_rel_diff:.1e})" if parity.ok
                   else "losses DIFFER: " + "; ".join(parity.problems[:3]))
        out.append(f"== {cand.path} vs {ref.path}: {speed}; {verdict}")
        code |= 0 if parity.ok else 1
    return code, out


def add_parser(sub) -> None:
    p = sub.add_parser("verify-log", help="verdict on MB training logs: overlap active, speedup, loss parity")
    p.add_argument("logs", nargs="+", metavar="LOG",
                   help="one log, or reference then candidate; a folder = all *.log below it (one run's ranks)")
    p.add_argument("--warmup", type=int, default=2, help="iterations excluded from the steady window")
    p.set_defaults(handler=_main)


def _main(args) -> int:
    code, lines = verify(args.logs, args.warmup)
    print("\n".join(lines))
    return code
