"""``mbridge-ep-overlap verify-log LOG [LOG]``: MB training logs read as a user would (``tools.logs``).

Contract
--------
One log: a verdict (overlap active or not, and why), steady-window step time, loss health. The
warm-up is the first ``--warmup`` iteration lines of each log, by position (a log resumed at
iteration 100 has its warm-up too); ``--warmup`` must be >= 0. Two logs (reference first, e.g.
overlap off, then on): also the speedup over the iterations both logs have after their warm-up,
and loss parity (``numerics.compare_losses``); two logs with no iteration in common get neither
(exit 1, saying so). Exit 0 when the logs parse and the losses are healthy and match; 1 when they
do not, or when a log of the two has no iteration lines (then it says which, and that MB prints
them on the last rank); 2 for an unreadable file, an empty folder or a file that is not a
Megatron-Bridge training log (one line, no traceback).
"""

from __future__ import annotations

import math
import statistics

from ..base.errors import UsageError
from ..lab.numerics import compare_losses
from ..runtime.exits import non_negative_int
from .logs import NO_ITERATION_LINES, LogReport, parse

_NO_ITERATIONS = (f"{NO_ITERATION_LINES}: MB prints them on the last rank only - give that rank's log too, "
                  "or the run's log folder")


def _verdict_lines(report: LogReport, warmup: int) -> list[str]:
    lines_out = []
    if report.has_summary:
        state = "ACTIVE" if report.overlap_active else "NOT active"
        why = (f"overlap_moe_expert_parallel_comm={report.value('overlap_moe_expert_parallel_comm')}, "
               f"dispatcher={report.value('moe_token_dispatcher_type')}")
        if report.value("moe_token_dispatcher_type") == "flex":
            why += f", backend={report.value('moe_flex_dispatcher_backend')}"
        why += f", delay_wgrad={report.value('delay_wgrad_compute')}"
        if report.value("high_priority_a2a_comm_stream") == "True":
            why += ", high-priority all-to-all stream"
        lines_out.append(f"EP overlap {state} ({why})")
    else:
        lines_out.append("EP overlap: unknown (no configuration summary in this log)")
    n = len(report.series)
    steady = report.steady_ms(warmup)
    if steady:
        first = report.series.numbers[warmup]
        lines_out.append(f"{n} iterations; steady median {statistics.median(steady):.1f} ms/iteration "
                         f"(from iteration {first}, after the first {warmup} iteration lines)")
    elif not n:
        lines_out.append(_NO_ITERATIONS)
    else:
        lines_out.append(f"{n} iterations, none after the {warmup} warm-up iterations: no steady window")
    problems = [p for p in report.unhealthy() if p != NO_ITERATION_LINES]
    if n:
        lines_out.append("losses: " + ("UNHEALTHY: " + "; ".join(problems[:5])
                                       + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
                                       if problems else "finite, 0 skipped, 0 NaN, grad norm steady"))
    else:
        lines_out.append("losses: not checked (no iteration lines)")
    for f in report.fallbacks:
        lines_out.append(f"SILENT FALLBACK: {f}")
    for s in report.slow_paths:
        lines_out.append(f"SLOW PATH: {s}")
    return lines_out


def verify(paths: list[str], warmup: int = 2) -> tuple[int, list[str]]:
    if not 1 <= len(paths) <= 2:
        raise UsageError("number of logs", len(paths), "1 (verdict) or 2 (reference, candidate)", "wrong")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise UsageError("--warmup", warmup, "an integer >= 0 (iteration lines left out of the steady window)",
                         "bad")
    reports = [parse(p) for p in paths]
    out, code = [], 0
    for r in reports:
        out.append(f"== {r.path}")
        out += [f"  {line}" for line in _verdict_lines(r, warmup)]
        code |= 1 if r.unhealthy() or r.fallbacks else 0
    if len(reports) == 2:
        ref, cand = reports
        head = f"== {cand.path} vs {ref.path}"
        if not (len(ref.series) and len(cand.series)):
            out.append(f"{head}: not compared ({NO_ITERATION_LINES} in "
                       + " and ".join(r.path for r in reports if not len(r.series)) + ")")
            return code | 1, out
        if not set(ref.series.numbers) & set(cand.series.numbers):
            out.append(f"{head}: not compared (no iteration in common: {_span(ref)} vs {_span(cand)})")
            return code | 1, out
        a, b = ref.steady(warmup), cand.steady(warmup)
        common = sorted(set(a) & set(b))
        times = [a[i] for i in common], [b[i] for i in common]
        ok_times = common and all(math.isfinite(t) and t > 0 for t in (*times[0], *times[1]))
        speed = (f"speedup {statistics.median(times[0]) / statistics.median(times[1]):.3f}x over the "
                 f"{len(common)} steady iterations both have" if ok_times
                 else "no steady window both logs have, no speedup" if not common
                 else "no speedup: an elapsed time in the steady window is zero or not a number")
        parity = compare_losses(ref.losses(), cand.losses())
        verdict = (f"losses match (max rel diff {parity.max_rel_diff:.1e})" if parity.ok
                   else "losses DIFFER: " + "; ".join(parity.problems[:3]))
        out.append(f"{head}: {speed}; {verdict}")
        code |= 0 if parity.ok else 1
    return code, out


def _span(report: LogReport) -> str:
    return f"iterations {report.series.numbers[0]}-{report.series.numbers[-1]}"


def add_parser(sub) -> None:
    p = sub.add_parser("verify-log", help="verdict on MB training logs: overlap active, speedup, loss parity")
    p.add_argument("logs", nargs="+", metavar="LOG",
                   help="one log, or reference then candidate; a folder = all *.log below it (one run's ranks)")
    p.add_argument("--warmup", type=non_negative_int, default=2,
                   help="iteration lines (by position) left out of the steady window")
    p.set_defaults(handler=_main)


def _main(args) -> int:
    code, lines_out = verify(args.logs, args.warmup)
    print("\n".join(lines_out))
    return code
