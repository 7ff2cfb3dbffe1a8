"""Numbers as the benchmark and tune tables show them, and their ``results.json``.

Contract: ``num(x, spec)`` formats a measured value, ``'-'`` when it was not measured; ``pct(x)``
a fraction as a percentage (``signed``: with its sign); ``write_json(results, out)`` writes every
row of a run as ``out/results.json`` (the folder made when missing). No torch import.
"""

from __future__ import annotations

import json
from pathlib import Path


def num(x: float | None, spec: str) -> str:
    """``x`` formatted, '-' when not measured (an ok row without a steady window, say)."""
    return "-" if x is None else format(x, spec)


def pct(x: float | None, signed: bool = False) -> str:
    return "-" if x is None else (f"{x:+.0%}" if signed else f"{x:.0%}")


def write_json(results: list, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps([r.__dict__ for r in results], indent=2, default=str))
