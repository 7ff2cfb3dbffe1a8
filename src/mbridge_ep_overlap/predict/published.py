"""Megatron-Bridge's published performance rows as checks of the step-time model.

Contract
--------
* ``ROWS`` - the rows of ``published.json``: each a published measurement (MB's
  ``performance-summary.md`` / ``performance-summary-archive.md`` row, verbatim, or a pull request's
  quoted step times), the NVIDIA perf recipe function it maps to, and the EP-overlap setting to
  build it with (None: the recipe's own). GBS, MBS, sequence, parallel sizes, GPUs and tokens/s/GPU
  are parsed from the row text, never typed a second time; ``PublishedRow.published_step_s`` is
  GBS x seq / (tokens/s/GPU x GPUs) for a summary row, the quoted step for a pull request's.
  ``EXCLUDED`` - the latest rows whose shipped recipe has another layout, with the field that differs.
* ``Predicted.of(config_prediction, overlap)`` - the step the model predicts for the recipe as
  ``plan`` builds it (overlap on: the on step, else the off step), its confidence and what it
  does not model. Building the recipe needs Megatron-Bridge and is the caller's part (the unit
  test ``tests/unit/test_predict_published.py`` builds each one through the library's pipeline).
* ``check(rows, predicted)`` -> ``PublishedCheck`` per row; ``markdown_table`` / ``markdown_summary``
  render the generated section of ``docs/prediction.md`` (the count within ``TARGET`` and the
  median error are computed here).

These rows are checks only: nothing in ``calibration.json`` or ``hardware.json`` is fitted to them,
and the calibration code never reads this module. Stdlib only.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

TARGET = 0.10  # the model's stated accuracy on step time (validation.TARGET)
_COLUMNS = {"#-GPUs": "num_gpus", "GBS": "gbs", "MBS": "mbs", "Sequence Length": "seq", "TP": "tp", "PP": "pp",
            "CP": "cp", "VP": "vp", "EP": "ep", "Tokens / sec / GPU": "tokens_per_s_per_gpu"}
LAYOUT = ("gbs", "mbs", "seq", "tp", "pp", "cp", "vp", "ep")


def parse_row(header: str, row: str) -> dict[str, Any]:
    """The numbers of one markdown row under its header (``n/a`` -> None) plus ``gpu`` and ``precision``."""
    names = [c.strip() for c in header.strip().strip("|").split("|")]
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    if len(names) != len(cells):
        raise ValueError(f"row has {len(cells)} cells, its header {len(names)}: {row!r}")
    values = dict(zip(names, cells))
    out: dict[str, Any] = {key: (None if values[col] == "n/a" else int(values[col]))
                           for col, key in _COLUMNS.items() if col in values}
    out["gpu"] = values["System"].removeprefix("DGX-").lower()
    out["precision"] = values["Precision"]
    return out


@dataclass(frozen=True)
class PublishedRow:
    id: str
    model: str
    gpu: str
    num_gpus: int
    precision: str
    layout: dict[str, int | None]  # LAYOUT fields as published
    recipe: str  # MODULE:FUNCTION of MB's perf recipe
    overlap: bool | None  # None: the recipe's own setting
    source: dict[str, Any]
    tokens_per_s_per_gpu: int | None = None
    quoted_step_s: float | None = None

    @property
    def published_step_s(self) -> float:
        if self.quoted_step_s is not None:
            return self.quoted_step_s
        return self.layout["gbs"] * self.layout["seq"] / (self.tokens_per_s_per_gpu * self.num_gpus)

    @property
    def where(self) -> str:
        s = self.source
        if "pull" in s:
            return f"MB #{s['pull']}"
        return f"{s['file'].rsplit('/', 1)[-1].removesuffix('.md')} {s['release'].split()[0]}"


def _row(d: Mapping[str, Any]) -> PublishedRow:
    s = d["source"]
    if "row" in s:
        p = parse_row(s["header"], s["row"])
        layout = {k: p[k] for k in LAYOUT}
        return PublishedRow(id=d["id"], model=d["model"], gpu=p["gpu"], num_gpus=p["num_gpus"], precision=p["precision"],
                            layout=layout, recipe=d["recipe"], overlap=d.get("overlap"), source=dict(s),
                            tokens_per_s_per_gpu=p["tokens_per_s_per_gpu"])
    layout = {k: d.get(k, d.get("layout", {}).get(k)) for k in LAYOUT}
    return PublishedRow(id=d["id"], model=d["model"], gpu=d["gpu"], num_gpus=d["num_gpus"], precision="BF16",
                        layout=layout, recipe=d["recipe"], overlap=d.get("overlap"), source=dict(s),
                        quoted_step_s=float(d["published_step_s"]))


_DOC = json.loads(Path(__file__).with_name("published.json").read_text())
ROWS: tuple[PublishedRow, ...] = tuple(_row(d) for d in _DOC["rows"])
EXCLUDED: tuple[dict[str, Any], ...] = tuple(_DOC["excluded"])


@dataclass(frozen=True)
class Predicted:
    step_s: float
    confidence: str  # 'validated', 'provisional' or 'low'
    not_modelled: tuple[str, ...] = ()
    overlap: bool = False

    @classmethod
    def of(cls, cp: Any, overlap: bool) -> "Predicted":
        """From a ``config.ConfigPrediction`` of the recipe as built (``overlap``: EP overlap on there)."""
        p = cp.prediction
        return cls(step_s=p.on_step_s if overlap else p.off_step_s, confidence=cp.confidence.split(":")[0],
                   not_modelled=tuple(n.split(" (")[0].split(":")[0] for n in cp.not_modelled), overlap=overlap)


@dataclass(frozen=True)
class PublishedCheck:
    row: PublishedRow
    predicted: Predicted
    error: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "error", self.predicted.step_s / self.row.published_step_s - 1)

    @property
    def within(self) -> bool:
        return abs(self.error) <= TARGET


def check(rows: Sequence[PublishedRow], predicted: Mapping[str, Predicted]) -> list[PublishedCheck]:
    """One check per row, in ``rows`` order; ``predicted`` maps each row id to its prediction."""
    return [PublishedCheck(r, predicted[r.id]) for r in rows]


def markdown_table(checks: Sequence[PublishedCheck]) -> str:
    lines = ["| row | source | overlap | published s | predicted s | error | within 10% | confidence | not modelled |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        r, p = c.row, c.predicted
        lines.append(f"| {r.id} | {r.where} | {'on' if p.overlap else 'off'} | {r.published_step_s:.2f} | "
                     f"{p.step_s:.2f} | {100 * c.error:+.1f}% | {'yes' if c.within else '**no**'} | {p.confidence} | "
                     f"{', '.join(p.not_modelled) or '-'} |")
    return "\n".join(lines)


def markdown_summary(checks: Sequence[PublishedCheck]) -> str:
    within = sum(c.within for c in checks)
    median = statistics.median(abs(c.error) for c in checks)
    signed = statistics.median(c.error for c in checks)
    return (f"**{within} of {len(checks)} within 10%**; median |error| {100 * median:.1f}% "
            f"(median signed error {100 * signed:+.1f}%).")


def markdown_excluded() -> str:
    return "\n".join(
        f"* `{e['row']}` ({e['release'].split()[0]}): `{e['recipe'].rsplit(':', 1)[-1]}` has "
        + ", ".join(f"{k} {v if v is not None else 'n/a'}" for k, v in e["recipe_has"].items())
        + " where the row has " + ", ".join(f"{k} {v if v is not None else 'n/a'}" for k, v in e["row_has"].items())
        for e in EXCLUDED)
