"""A gradient norm that should be one number for the whole model, printed by two ranks with different values.

Contract
--------
``RankNorms.feed(text, where, rank, run)`` keeps, per run (the input path the line came from: two runs compared are
never mixed) and iteration (``iteration N`` / ``step N`` in the line, else none), the first gradient norm a line gives for each
rank (``total_norm=X`` / ``grad norm: X`` / ``grad_norm X`` / ``gradient norm = X``, the rank written in the line as
``rank N`` or given by the log's rank prefix; at most 9 digits). ``findings(norms)`` gives one
``grad-norm-differs-across-ranks`` finding (``GRAD_NORM_DIFFERS``, ``signatures.numerics``) for the first (run,
iteration) where at least two ranks gave a norm and the largest is more than ``SPREAD`` above the smallest: a
clipped norm must be the same on every rank; when it is not, part of it (the expert parameters, sharded over the EP
axis) was summed over a smaller group than the parameters it clips, so ranks clip the shared parameters by different
factors and their replicas drift apart. The finding names the ranks, their values and the ratio. Never raises for
what is in the lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .report import Finding
from .signatures.numerics import GRAD_NORM_DIFFERS

SPREAD = 0.01
"""Relative difference above which two ranks' norms are not one norm (the same all-reduced value prints equal)."""
MAX_RANKS = 256
NORM = re.compile(r"\b(?:total_norm|grad[_ ]norm|gradient norm)\s*[=:]?\s*(?P<value>[0-9]+(?:\.[0-9]+)?(?:e[-+]?\d+)?)\b",
                  re.I)
RANK = re.compile(r"\brank\s*[=:\[]?\s*(?P<rank>\d{1,5})\b", re.I)
ITERATION = re.compile(r"\b(?:iteration|iter|step)\s*[:=]?\s*(?P<n>\d{1,9})\b", re.I)


@dataclass
class RankNorms:
    norms: dict[tuple[str, str], dict[str, tuple[float, str]]] = field(default_factory=dict)
    """(run, iteration) -> rank -> (first norm, its evidence line)."""

    def feed(self, text: str, where: str, rank: str | None = None, run: str | None = None) -> None:
        if "norm" not in text or len(self.norms) >= MAX_RANKS or (m := NORM.search(text)) is None:
            return
        r = RANK.search(text[:m.start()])
        who = r["rank"] if r else rank
        if who is None or not who.isdigit() or len(who) > 9:
            return
        it = ITERATION.search(text)
        ranks = self.norms.setdefault((run or "", it["n"] if it else ""), {})
        if who in ranks or len(ranks) >= MAX_RANKS:
            return
        try:
            value = float(m["value"])
        except ValueError:
            return
        ranks[who] = (value, f"{where}: {text.strip()[:300]}")

    def finish(self) -> None:
        """Kept across sources: one rank per log file is the usual layout."""


def findings(norms: RankNorms) -> list[Finding]:
    for ranks in norms.norms.values():
        values = {r: v for r, (v, _) in ranks.items() if v > 0}
        if len(values) < 2:
            continue
        lo, hi = min(values, key=values.get), max(values, key=values.get)
        if values[hi] <= values[lo] * (1 + SPREAD):
            continue
        f = Finding(GRAD_NORM_DIFFERS)
        for r in (hi, lo):
            f.add(ranks[r][1])
        f.detail.append("grad norm per rank: " + ", ".join(f"rank {r} {v:g}" for r, v in sorted(
            values.items(), key=lambda kv: (len(kv[0]), kv[0]))) + f" (rank {hi} / rank {lo} = {values[hi] / values[lo]:.3g}x)")
        return [f]
    return []
