"""Loss parity between two runs (overlap off vs on): the shipped comparison the tests also use.

Contract: ``compare_losses(reference, candidate, rtol)`` compares per-iteration losses of the
iterations both runs have. It fails (``ok`` False) on a missing or non-finite loss, on a skipped
iteration, on different iteration sets, or when any relative difference exceeds ``rtol``. The
default tolerance, ``BF16_RTOL``, is documented in docs/benchmarks.md: overlap reorders bf16
kernels across microbatches, so bitwise equality is not promised; 2 x 2**-8 (two bf16 ulps at 1.0)
bounds what we accept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

BF16_RTOL = 2 * 2.0**-8


@dataclass
class ParityResult:
    ok: bool
    max_abs_diff: float
    max_rel_diff: float
    iterations: list[int]
    problems: list[str] = field(default_factory=list)

    def table(self, reference: dict[int, float], candidate: dict[int, float], names=("off", "on")) -> str:
        rows = [f"| iteration | {names[0]} loss | {names[1]} loss | rel diff |", "|---|---|---|---|"]
        for it in self.iterations:
            a, b = reference[it], candidate[it]
            rows.append(f"| {it} | {a:.6f} | {b:.6f} | {abs(a - b) / max(abs(a), 1e-12):.2e} |")
        return "\n".join(rows)


def compare_losses(
    reference: dict[int, float | None],
    candidate: dict[int, float | None],
    rtol: float = BF16_RTOL,
    skipped: set[int] | None = None,
) -> ParityResult:
    problems = []
    if set(reference) != set(candidate):
        problems.append(f"iterations differ: {sorted(set(reference) ^ set(candidate))}")
    common = sorted(set(reference) & set(candidate))
    if not common:
        problems.append("no common iterations")
    max_abs = max_rel = 0.0
    for it in common:
        a, b = reference[it], candidate[it]
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            problems.append(f"iteration {it}: non-finite or missing loss ({a}, {b})")
            continue
        diff = abs(a - b)
        rel = diff / max(abs(a), 1e-12)
        max_abs, max_rel = max(max_abs, diff), max(max_rel, rel)
        if rel > rtol:
            problems.append(f"iteration {it}: {a} vs {b} (rel diff {rel:.2e} > {rtol:.2e})")
    for it in sorted(skipped or ()):
        problems.append(f"iteration {it} was skipped")
    return ParityResult(not problems, max_abs, max_rel, common, problems)


def losses_from_summary(summary: dict) -> tuple[dict[int, float | None], set[int]]:
    """(iteration -> loss, skipped iterations) from an ``evidence.RunRecorder`` summary."""
    steps = summary.get("steps", [])
    return {s["iteration"]: s["loss"] for s in steps}, {s["iteration"] for s in steps if s.get("skipped")}
