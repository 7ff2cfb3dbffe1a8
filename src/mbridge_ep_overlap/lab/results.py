"""The rows of a bench ``results.json``: ``VariantResult`` and the checked way back from JSON.

Contract: ``load_results(path)`` returns the ``VariantResult`` rows of a ``results.json`` written by
``bench`` (or ``bench tune``), every field checked for what the report reads (``ROW_FIELDS``:
types; finite numbers where the report computes; the profile numbers ``trace.analyze`` wrote) - or
raises one ``UsageError`` naming the file, the row and the field. ``result_from_row`` checks one row
(``RowError``). A ``launch_slurm.py --variants`` run folder is read back here too: ``read_manifest``
(its ``variants.json``, checked; None for a plain bench folder), ``array_rows`` (one row per task
from its ``summary.json``; a task that left none is a failed row) and ``predict_rows`` (each row's
step as the step-time model predicts it for that cluster, with a calibration when given:
``predicted_s``, ``prediction``; ``prediction_lines`` is its table); ``load_calibration`` reads the
calibration file ``calibrate`` wrote (bad usage when it is not one). Nothing here imports torch or
Megatron.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..base.errors import UsageError
from ..base.sizes import INT64_MAX, shown
from .numerics import losses_from_summary

MANIFEST = "variants.json"
"""The manifest of a ``launch_slurm.py --variants`` run folder (``tools.slurm_variants`` writes it)."""
MANIFEST_SCHEMA = "mbridge-ep-overlap variant array 1"
LINK = "nvlink"
"""bench's name for the link as the machine has it (calibrate uses only these rows)."""


@dataclass
class VariantResult:
    variant: str
    link: str
    ok: bool
    error: str = ""
    step_times: list[float] = field(default_factory=list)
    median_s: float | None = None
    spread_s: tuple[float, float] | None = None
    tokens_per_s: float | None = None
    peak_gib: float | None = None
    losses: dict[int, float | None] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)
    overlap_efficiency: dict | None = None
    speedup: float | None = None
    parity: str = ""
    finalized: dict = field(default_factory=dict)
    # idle-time breakdown (absent from older results.json: ``compare_to_baseline`` recomputes them)
    run: str = ""
    """The bench output folder the row was measured in."""
    run_s: float | None = None
    """Wall time of the whole torchrun job (start-up included): the tuner's run-time estimate."""
    overrides: list[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)
    share_of_gain: float | None = None
    """(off - variant) / (off - ideal), ideal = max(compute, all-to-all) from this row's profile."""
    share_of_gain_off_ideal: float | None = None
    """The same with the ideal of the off run's profile (no contention added by overlap)."""
    idle_step_s: float | None = None
    idle_estimated: bool = False
    """True: from a profile without ``idle_step_s`` (before the idle-time breakdown): a lower bound."""
    peak_vs_off: float | None = None
    compute_vs_off_s: float | None = None
    """Compute time per step added against off (kernel union; SM / memory contention)."""
    disqualified: str = ""
    """Set by ``bench tune``: why the row may not win (its losses or its peak memory)."""
    predicted_s: float | None = None
    """The step-time model's step for this row's config on the cluster it ran on (a Slurm variant array)."""
    prediction: str = ""
    """The calibration ``predicted_s`` was made with, or why none was made."""



def summarize_run(variant: str, link: str, summary: dict, warmup: int, tokens_per_step: int) -> VariantResult:
    """A row from a run's evidence summary: steady-window median and spread (after ``warmup`` steps,
    profiled steps excluded), tokens/s, peak memory, losses, the profile analysis."""
    steps = summary["steps"]
    profiled = set(range(*summary["profile"]["steps"])) if summary.get("profile") else set()
    times = [s["step_time_s"] for i, s in enumerate(steps) if i >= warmup and i not in profiled]
    losses, skipped = losses_from_summary(summary)
    r = VariantResult(variant, link, ok=True, step_times=[s["step_time_s"] for s in steps],
                      losses=losses, skipped=sorted(skipped), finalized=summary.get("finalized", {}))
    if times:
        r.median_s = statistics.median(times)
        r.spread_s = (min(times), max(times))
        r.tokens_per_s = tokens_per_step / r.median_s
    r.peak_gib = max(summary.get("peak_memory_gib_per_rank") or [0.0])
    if summary.get("profile"):
        r.overlap_efficiency = summary["profile"]["overlap_efficiency"]
    return r


def prediction_lines(results: list[VariantResult]) -> list[str]:
    """'measured vs predicted' table of the rows a prediction was tried for ([] when none): measured
    median step, the model's step, error = predicted / measured - 1, and the calibration used."""
    rows = [r for r in results if r.prediction]
    if not rows:
        return []
    out = ["", "Measured vs predicted (step-time model, docs/prediction.md; error = predicted / measured - 1):", "",
           "| link | variant | measured step s | predicted step s | error | calibration |", "|---|---|---|---|---|---|"]
    for r in rows:
        pred = "-" if r.predicted_s is None else f"{r.predicted_s:.3f}"
        err = "-" if r.predicted_s is None or not r.median_s else f"{r.predicted_s / r.median_s - 1:+.1%}"
        out.append(f"| {r.link} | {r.variant} | {r.median_s:.3f} | {pred} | {err} | {r.prediction} |")
    return out


# ---- reading results.json back ------------------------------------------------------------------
def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _finite(x) -> bool:
    """A float that is finite, or an int within int64 (a larger one overflows the report's float math)."""
    if isinstance(x, int) and not isinstance(x, bool):
        return abs(x) <= INT64_MAX
    return isinstance(x, float) and math.isfinite(x)


def _optional(check):
    return lambda x: x is None or check(x)


def _positive(x) -> bool:
    return _finite(x) and x > 0


def _non_negative(x) -> bool:
    return _finite(x) and x >= 0


def _losses(x) -> bool:
    # keys: iteration numbers as JSON writes them; a NaN or inf loss is a measurement (the parity says so)
    return isinstance(x, dict) and all(
        re.fullmatch(r"-?[0-9]{1,18}", str(k) if not isinstance(k, int) else shown(k))
        and (v is None or isinstance(v, float) or (_number(v) and abs(v) <= INT64_MAX)) for k, v in x.items())


def _text(x) -> bool:
    return isinstance(x, str)


_OPTIONAL_FINITE = (_optional(_finite), "a finite number, or null")
# Every field of a row and what the report (compare_to_baseline, markdown, plot, summary_line) needs
# of it; a row is validated whole before anything is computed or written.
ROW_FIELDS: dict[str, tuple] = {
    "variant": (lambda x: isinstance(x, str) and x != "", "a non-empty string"),
    "link": (lambda x: isinstance(x, str) and x != "", "a non-empty string"),
    "ok": (lambda x: isinstance(x, bool), "true or false"),
    "error": (_text, "a string"),
    "step_times": (lambda x: isinstance(x, list) and all(_positive(t) for t in x), "a list of finite numbers > 0"),
    "median_s": (_optional(_positive), "a finite number > 0, or null"),
    "spread_s": (_optional(lambda x: isinstance(x, (list, tuple)) and len(x) == 2 and all(_finite(t) for t in x)),
                 "two finite numbers [min, max], or null"),
    "tokens_per_s": (_optional(_non_negative), "a finite number >= 0, or null"),
    "peak_gib": (_optional(_non_negative), "a finite number >= 0, or null"),
    "losses": (_losses, "a mapping of iteration number -> loss (a number or null)"),
    "skipped": (lambda x: isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x),
                "a list of iteration numbers"),
    "overlap_efficiency": (_optional(lambda x: isinstance(x, dict)), "a profile analysis (a mapping), or null"),
    "speedup": (_optional(_positive), "a finite number > 0, or null"),
    "parity": (_text, "a string"),
    "finalized": (lambda x: isinstance(x, dict), "a mapping of finalized fields"),
    "run": (_text, "a string"),
    "run_s": (_optional(_non_negative), "a finite number >= 0, or null"),
    "overrides": (lambda x: isinstance(x, list) and all(isinstance(o, str) for o in x), "a list of strings"),
    "env": (lambda x: isinstance(x, dict), "a mapping"),
    "share_of_gain": _OPTIONAL_FINITE,
    "share_of_gain_off_ideal": _OPTIONAL_FINITE,
    "idle_step_s": _OPTIONAL_FINITE,
    "idle_estimated": (lambda x: isinstance(x, bool), "true or false"),
    "peak_vs_off": _OPTIONAL_FINITE,
    "compute_vs_off_s": _OPTIONAL_FINITE,
    "disqualified": (_text, "a string"),
    "predicted_s": (_optional(_positive), "a finite number > 0, or null"),
    "prediction": (_text, "a string"),
}
# The profile numbers the report computes with (trace.analyze's OverlapEfficiency); the three read
# for the table when an all-to-all kernel was recognized (a2a_s > 0) must be there.
_EFFICIENCY_NUMBERS = ("iterations", "a2a_s", "comm_s", "compute_s", "hidden_s", "exposed_s", "hidden_fraction",
                      "ideal_step_s", "measured_step_s", "idle_step_s", "busy_s")
_EFFICIENCY_NEEDED_WITH_A2A = ("hidden_fraction", "exposed_s", "ideal_step_s")


class RowError(ValueError):
    """One field of a results row is not what the report needs."""

    def __init__(self, field_name: str, value, required: str) -> None:
        self.field, self.value, self.required = field_name, value, required
        super().__init__(f"field {field_name} = {short_value(value)}; allowed: {required}")


def short_value(value) -> str:
    """``value`` for a one-line error: at most 60 characters, never failing (an int too long for
    text, a container holding one)."""
    if isinstance(value, int) and not isinstance(value, bool):
        text = shown(value)  # an int of thousands of digits cannot even be turned into text
    else:
        try:
            text = repr(value)
        except ValueError:  # a container holding such an int
            text = f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def result_from_row(d) -> VariantResult:
    """A ``VariantResult`` from one row of a results.json, every field checked (RowError otherwise)."""
    if not isinstance(d, dict):
        raise RowError("(the row itself)", d, "a mapping of VariantResult fields")
    for name in ("variant", "link", "ok"):
        if name not in d:
            raise RowError(name, None, ROW_FIELDS[name][1] + " (missing)")
    for name, value in d.items():
        if name not in ROW_FIELDS:
            raise RowError(name, value, "only VariantResult fields (" + ", ".join(ROW_FIELDS) + ")")
        check, required = ROW_FIELDS[name]
        if not check(value):
            raise RowError(name, value, required)
    e = d.get("overlap_efficiency") or {}
    for name in _EFFICIENCY_NUMBERS:
        value = e.get(name)
        needed = name in _EFFICIENCY_NEEDED_WITH_A2A and e.get("a2a_s")
        if (value is None and needed) or (value is not None and not _finite(value)) or (
                name == "iterations" and value is not None and value <= 0):
            required = "a finite number > 0" if name == "iterations" else "a finite number"
            raise RowError(f"overlap_efficiency.{name}", value,
                           required + ("" if needed else ", or null") + (" (a2a_s > 0)" if needed else ""))
    phases = e.get("phases")  # the numbers bench tune orders its knobs by (tune.evidence)
    if phases is not None and not isinstance(phases, dict):
        raise RowError("overlap_efficiency.phases", phases, "a mapping (trace.analyze's phases), or null")
    for name in ("first_forward_s", "last_backward_s", "outside_step_s", "inside", "outside"):
        value = (phases or {}).get(name)
        spans = name in ("inside", "outside")
        if not (value is None or (_finite(value) if not spans else isinstance(value, dict) and all(
                x is None or _finite(x) for x in value.values()))):
            raise RowError(f"overlap_efficiency.phases.{name}", value,
                           ("a mapping of finite numbers" if spans else "a finite number") + ", or null")
    r = VariantResult(**d)
    r.spread_s = tuple(r.spread_s) if r.spread_s else None
    r.losses = {int(k): v for k, v in (r.losses or {}).items()}
    return r


def load_results(path: Path) -> list[VariantResult]:
    """The ``VariantResult`` rows of a ``results.json`` written by ``run_bench``, each field checked
    for what the report reads (types; finite numbers where numbers are needed). UsageError naming the
    file - and the row and field - when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise UsageError("bench results file", str(path), f"a results.json written by bench ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})", "unreadable") from None
    if not isinstance(data, list) or not data:
        found = "an empty list" if isinstance(data, list) else f"a {type(data).__name__}"
        raise UsageError("bench results file", str(path), f"a results.json written by bench: a list of rows (found {found})",
                         "invalid")
    rows, bad = [], []
    for i, d in enumerate(data, 1):
        try:
            rows.append(result_from_row(d))
        except RowError as e:
            label = f" ({d.get('link')}/{d.get('variant')})" if isinstance(d, dict) and "variant" in d else ""
            bad.append((f"row {i}{label}, field {e.field} =", Shown(e.value), e.required))
    if len(bad) == 1:
        where, value, required = bad[0]
        raise UsageError(f"bench results file {str(path)!r}, {where}", value, required, "invalid")
    if bad:  # every bad row named, in one line
        raise UsageError(f"bench results file {str(path)!r}: {len(bad)} bad rows:", _BadRows(bad),
                         "the fields bench writes (lab/results.py ROW_FIELDS)", "invalid")
    return rows


class _BadRows:
    """The bad rows of a results file, each with its first bad field and what it needs, for one line."""

    def __init__(self, rows: list[tuple[str, "Shown", str]]) -> None:
        self.rows = rows

    def __repr__(self) -> str:
        return "; ".join(f"{where} {value!r} (required: {required})" for where, value, required in self.rows)


class Shown:
    """A value shown shortened in a one-line error."""

    def __init__(self, value) -> None:
        self.value = value

    def __repr__(self) -> str:
        return short_value(self.value)


# ---- a launch_slurm.py --variants run folder (bench report) -----------------------------------------------
def read_manifest(folder: Path) -> dict | None:
    """The folder's ``variants.json``, checked; None when the folder has none (a plain bench folder)."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    try:
        m = json.loads(path.read_text())
        tasks = m["tasks"]
        ok = m.get("schema") == MANIFEST_SCHEMA and isinstance(m.get("cluster"), dict) and isinstance(tasks, list) \
            and tasks and all(isinstance(t, dict) and isinstance(t.get("variant"), str) and isinstance(t.get("folder"), str)
                              and isinstance(t.get("task"), int) for t in tasks)
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise UsageError("--report folder", str(folder), f"a {MANIFEST} written by launch_slurm.py --variants "
                         f"({type(e).__name__})", "unreadable") from None
    if not ok:
        raise UsageError("--report folder", str(folder), f"a {MANIFEST} written by launch_slurm.py --variants "
                         f"(schema {MANIFEST_SCHEMA!r}, a cluster and a list of tasks)", "invalid")
    return m


def array_rows(folder: Path, m: dict) -> list:
    """One row per array task from its ``summary.json`` (bench's ``summarize_run``); a task that left
    none is a failed row naming its Slurm output."""
    rows = []
    for t in m["tasks"]:
        run = Path(folder) / t["folder"]
        path = run / "summary.json"
        link = t.get("link") or LINK
        if not path.exists():
            rows.append(VariantResult(t["variant"], link, ok=False, run=str(folder),
                                      error=f"array task {t['task']} left no {path} (see its Slurm output "
                                            f"{m.get('job')}-<array id>_{t['task']}.out)"))
            continue
        try:
            summary = json.loads(path.read_text())
            fin = summary["finalized"]
            tokens = int(fin["global_batch_size"]) * int(fin.get("seq_length") or 0)
            r = summarize_run(t["variant"], link, summary, int(m.get("warmup") or 0), tokens)
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            raise UsageError("array task summary", str(path), "an evidence summary run_script.py wrote "
                             f"({type(e).__name__}: {str(e)[:120]})", "invalid") from None
        r.run = str(folder)
        rows.append(r)
    return rows


def predict_rows(rows: list, m: dict, calibration=None, source: str = "shipped calibration") -> None:
    """Each measured row's step as the step-time model predicts it for the manifest's cluster
    (``calibration``: a ``predict.Calibration``; None: the shipped one): ``predicted_s`` and
    ``prediction`` (the calibration used, or why no prediction was made)."""
    from ..predict.cluster_calibration import MeasuredRow, predicted_step  # start-up: the model only when used
    from ..predict.inputs import Cluster

    c = m["cluster"]
    for r in rows:
        if not r.ok or r.median_s is None:
            continue
        try:
            cluster = Cluster(gpu=str(c.get("gpu")), num_gpus=int(c["num_gpus"]), gpus_per_node=c.get("gpus_per_node"))
            row = MeasuredRow(id=f"{r.link}/{r.variant}", variant=r.variant, median_s=r.median_s, finalized=r.finalized)
            r.predicted_s, r.prediction = predicted_step(row, cluster, calibration), source
        except (ValueError, KeyError, TypeError, ArithmeticError) as e:
            r.predicted_s, r.prediction = None, f"not made ({str(e).splitlines()[0][:160] if str(e) else type(e).__name__})"


def load_calibration(path: str, flag: str = "--calibration"):
    """The ``ClusterCalibration`` in ``path``; a file ``calibrate`` did not write is bad usage (one line)."""
    from ..predict.cluster_calibration import ClusterCalibration  # start-up: the model only when used

    try:
        return ClusterCalibration.load(path)
    except ValueError as e:
        raise UsageError(flag, path, f"a file written by `mbridge-ep-overlap calibrate` ({e})", "invalid") from None
