"""A gradient norm that should be one number for the whole model, printed by two ranks with different values.

Contract
--------
``RankNorms.feed(text, where, rank)`` keeps, per rank, the first gradient norm a line gives for it
(``total_norm=X`` / ``grad norm: X`` / ``grad_norm X`` / ``gradient norm = X``, the rank written in the line as
``rank N`` or given by the log's rank prefix). ``findings(norms)`` gives one ``grad-norm-differs-across-ranks``
finding (``GRAD_NORM_DIFFERS``, ``signatures.numerics``) when at least two ranks gave a norm and the largest is more
than ``SPREAD`` above the smallest: a clipped norm must be the same on every rank; when it is not, part of it (the
expert parameters, sharded over the EP axis) was summed over a smaller group than the parameters it clips, so
ranks clip the shared parameters by different factors and their replicas drift apart. The finding names the ranks,
their values and the ratio. Never raises for what is in the lines.
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


@dataclass
class RankNorms:
    norms: dict[str, tuple[float, str]] = field(default_factory=dict)
    """rank -> (first norm, its evidence line)."""

    def feed(self, text: str, where: str, rank: str | None = None) -> None:
        if "norm" not in text or len(self.norms) >= MAX_RANKS or (m := NORM.search(text)) is None:
            return
        r = RANK.search(text[:m.start()])
        who = r["rank"] if r else rank
        if who is None or who in self.norms:
            return
        try:
            value = float(m["value"])
        except ValueError:
            return
        self.norms[who] = (value, f"{where}: {text.strip()[:300]}")

    def finish(self) -> None:
        """Kept across sources: one rank per log file is the usual layout."""


def findings(norms: RankNorms) -> list[Finding]:
    values = {r: v for r, (v, _) in norms.norms.items() if v > 0}
    if len(values) < 2:
        return []
    lo, hi = min(values, key=values.get), max(values, key=values.get)
    if values[hi] <= values[lo] * (1 + SPREAD):
        return []
    f = Finding(GRAD_NORM_DIFFERS)
    for r in (hi, lo):
        f.add(norms.norms[r][1])
    f.detail.append("grad norm per rank: " + ", ".join(f"rank {r} {v:g}" for r, v in sorted(values.items(),
                                                                                              key=lambda kv: int(kv[0])))
                    + f" (rank {hi} / rank {lo} = {values[hi] / values[lo]:.3g}x)")
    return [f]
