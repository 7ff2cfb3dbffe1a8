"""Predicted vs measured: every bench row on 2x H200 and the published anchors.

Contract
--------
* ``bench_table(rows, calibration)`` -> ``BenchCheck`` per bench row: role (``calibration`` - the
  row was fitted on; ``validation`` - a shape never used for fitting; ``same-shape`` - another run
  of a calibration shape, e.g. another day or 32 microbatches; ``not modelled``), measured and
  predicted step time, speedup (against the same run's overlap-off row, as the bench reports it),
  share of the all-to-all hidden, and the relative errors.
* ``ANCHORS`` - published measurements with what is and is not known about their setup (data:
  ``anchors.json``);
  ``anchor_table(calibration)`` -> ``AnchorCheck`` per anchor (predicted vs published speedup,
  whether it is inside the stated tolerance).
* ``markdown_*`` render both as the tables of ``docs/prediction.md``;
  ``python -m mbridge_ep_overlap.predict.validation FILES...`` prints them.

The numbers are computed here, never typed in: the tests and the doc use the same functions.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .calibrate import (DEFAULT_CALIBRATION_IDS, NOT_MODELLED_VARIANTS, BenchRow, bench_cluster, bench_inputs,
                        load_rows, predicted_for)
from .costs import Calibration, default_calibration
from .inputs import Cluster, StepInputs
from .model import predict

TARGET = 0.10  # the target: within 10% on step time and speedup

# The shapes the shipped calibration used (the shape key below); every row of another shape is a
# validation row; rows of these shapes outside DEFAULT_CALIBRATION_IDS are "same-shape".


def _shape_key(row: BenchRow) -> tuple:
    i = bench_inputs(row).with_(dispatcher="alltoall", high_priority_a2a=False, num_microbatches=1)
    return (i.hidden_size, i.num_attention_heads, i.kv_channels, i.moe_ffn_hidden_size, i.moe_router_topk,
            i.micro_batch_size, i.seq_length)


@dataclass(frozen=True)
class BenchCheck:
    row: str
    role: str
    link: str
    variant: str
    shape: str
    measured_step_s: float
    predicted_step_s: float | None
    step_error: float | None
    measured_speedup: float | None
    predicted_speedup: float | None
    speedup_error: float | None
    measured_hidden: float | None
    predicted_hidden: float | None
    note: str = ""


def bench_table(rows: Sequence[BenchRow], calibration: Calibration | None = None,
                calibration_ids: Sequence[str] = DEFAULT_CALIBRATION_IDS) -> list[BenchCheck]:
    cal = calibration or default_calibration()
    ids = set(calibration_ids)
    cal_shapes = {_shape_key(r) for r in rows if r.id in ids}
    cal_pairs = {(_shape_key(r), r.variant) for r in rows if r.id in ids}
    out = []
    for r in rows:
        if r.id in ids:
            role = "calibration"
        elif r.variant in NOT_MODELLED_VARIANTS:
            role = "not modelled"
        elif (_shape_key(r), r.variant) in cal_pairs:
            role = "same-shape"  # a fitted shape and variant, another run / microbatch count
        elif _shape_key(r) in cal_shapes:
            role = "variant-check"  # a fitted shape, a variant never fitted on it
        else:
            role = "validation"  # a shape never used for fitting
        meas_h = (r.profile or {}).get("hidden_fraction") if r.variant != "off" else None
        if role == "not modelled":
            out.append(BenchCheck(r.id, role, r.link, r.variant, r.shape, r.median_s, None, None, r.speedup, None,
                                  None, meas_h, None, NOT_MODELLED_VARIANTS[r.variant]))
            continue
        p = predicted_for(r, cal)
        if r.variant == "off":
            pred, spd, hid = p.off_step_s, None, None
        else:
            base = predict(bench_inputs(r).with_(dispatcher="alltoall", high_priority_a2a=False),
                           bench_cluster(r, cal), cal)
            pred, spd, hid = p.on_step_s, base.off_step_s / p.on_step_s, p.hidden_fraction
        note = ""
        if r.variant in ("deepep", "hybridep") and r.link == "throttled":
            note = "flex kernels use NVLink; only NCCL (DP sync) is throttled"
        if meas_h is not None and r.variant in ("deepep", "hybridep") and not meas_h:
            meas_h = None  # profile analysed before flex kernels were classified (benchmarks.md)
        m_spd = r.speedup if r.variant != "off" else None
        out.append(BenchCheck(
            r.id, role, r.link, r.variant, r.shape, r.median_s, pred, pred / r.median_s - 1, m_spd, spd,
            (spd / m_spd - 1) if (spd and m_spd) else None, meas_h, hid, note))
    return out


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Anchor:
    name: str
    source: str
    inputs: StepInputs
    cluster: Cluster
    measured_speedup: float
    measured_off_s: float | None  # step seconds when published
    measured_on_s: float | None
    tolerance: float  # relative, on the speedup
    known: str
    unknown: str
    comparable: bool = True  # False: not MCore's combined-1F1B; shown for scale only


def _load_anchors() -> tuple[Anchor, ...]:
    """``anchors.json``: each published measurement, its inputs and cluster, and the ratio its
    speedup was computed from (step seconds, TFLOP/s or tokens/s as published)."""
    doc = json.loads((Path(__file__).with_name("anchors.json")).read_text())
    return tuple(
        Anchor(name=a["name"], source=a["source"], inputs=StepInputs(**a["inputs"]), cluster=Cluster(**a["cluster"]),
               measured_speedup=a["speedup_ratio"]["numerator"] / a["speedup_ratio"]["denominator"],
               measured_off_s=a["measured_off_s"], measured_on_s=a["measured_on_s"], tolerance=a["tolerance"],
               known=a["known"], unknown=a["unknown"], comparable=a["comparable"])
        for a in doc["anchors"])


ANCHORS: tuple[Anchor, ...] = _load_anchors()


@dataclass(frozen=True)
class AnchorCheck:
    name: str
    measured_speedup: float
    predicted_speedup: float
    speedup_error: float
    within_tolerance: bool
    comparable: bool
    predicted_off_s: float
    predicted_on_s: float
    measured_off_s: float | None
    measured_on_s: float | None
    hidden_fraction: float
    tolerance: float


def anchor_table(calibration: Calibration | None = None) -> list[AnchorCheck]:
    cal = calibration or default_calibration()
    out = []
    for a in ANCHORS:
        p = predict(a.inputs, a.cluster, cal)
        err = p.speedup / a.measured_speedup - 1
        out.append(AnchorCheck(a.name, a.measured_speedup, p.speedup, err, abs(err) <= a.tolerance, a.comparable,
                               p.off_step_s, p.on_step_s, a.measured_off_s, a.measured_on_s, p.hidden_fraction,
                               a.tolerance))
    return out


# ----------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def markdown_bench(checks: Sequence[BenchCheck]) -> str:
    head = ("| row | role | link | variant | shape | measured step s | predicted step s | error | measured speedup "
            "| predicted speedup | error | hidden measured / predicted |\n" + "|---" * 12 + "|")
    lines = [head]
    for c in checks:
        flag = " **(>10%)**" if c.step_error is not None and abs(c.step_error) > TARGET else ""
        sflag = " **(>10%)**" if c.speedup_error is not None and abs(c.speedup_error) > TARGET else ""
        hid = "-" if c.measured_hidden is None and c.predicted_hidden is None else \
            f"{_f(c.measured_hidden, '{:.0%}')} / {_f(c.predicted_hidden, '{:.0%}')}"
        lines.append(f"| `{c.row}` | {c.role} | {c.link} | {c.variant} | {c.shape} | {c.measured_step_s:.3f} | "
                     f"{_f(c.predicted_step_s)} | {_pct(c.step_error)}{flag} | {_f(c.measured_speedup)} | "
                     f"{_f(c.predicted_speedup)} | {_pct(c.speedup_error)}{sflag} | {hid} |"
                     + (f" {c.note}" if c.note else ""))
    return "\n".join(lines)


def markdown_anchors(checks: Sequence[AnchorCheck]) -> str:
    lines = ["| anchor | measured speedup | predicted speedup | error | within ±10% | predicted off / on s | "
             "published off / on s | predicted hidden |", "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        within = ("yes" if c.within_tolerance else "**no**") + ("" if c.comparable else " (not comparable)")
        pub = "-" if c.measured_off_s is None else f"{c.measured_off_s:.3f} / {c.measured_on_s:.3f}"
        lines.append(f"| {c.name} | {c.measured_speedup:.3f}x | {c.predicted_speedup:.3f}x | {_pct(c.speedup_error)} | "
                     f"{within} | {c.predicted_off_s:.3f} / {c.predicted_on_s:.3f} | {pub} | {c.hidden_fraction:.0%} |")
    return "\n".join(lines)


def summary(checks: Sequence[BenchCheck]) -> dict[str, dict[str, float | int]]:
    """Per role: rows, rows within 10% on step time, worst |step error|, worst |speedup error|."""
    out: dict[str, dict[str, float | int]] = {}
    for role in ("calibration", "validation", "variant-check", "same-shape"):
        cs = [c for c in checks if c.role == role and c.step_error is not None]
        if not cs:
            continue
        sp = [abs(c.speedup_error) for c in cs if c.speedup_error is not None]
        out[role] = {"rows": len(cs), "within_10pct_step": sum(abs(c.step_error) <= TARGET for c in cs),
                     "worst_step_error": max(abs(c.step_error) for c in cs),
                     "speedup_rows": len(sp), "within_10pct_speedup": sum(x <= TARGET for x in sp),
                     "worst_speedup_error": max(sp) if sp else 0.0}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    files = list(argv if argv is not None else sys.argv[1:])
    if files:
        checks = bench_table(load_rows(files))
        print(markdown_bench(checks))
        print()
        for role, s in summary(checks).items():
            print(f"{role}: {s}")
        print()
    print(markdown_anchors(anchor_table()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
