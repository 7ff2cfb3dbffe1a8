"""Refit the step-time model's cluster inputs from a user's own measured rows, and use the result.

Contract
--------
``MeasuredRow``: one measured run on the user's cluster - its variant (``off`` / ``overlap``), the
finalized fields it ran (``StepInputs.from_summary`` reads them), its median step in seconds and,
when it was profiled, its compute and all-to-all seconds over ``iterations`` profiled steps.
``fit_cluster(rows, cluster)`` refits, from the overlap-off rows only (overlap rows are what the
fitted model is checked against, never fitted to):

1. the compute efficiencies: with two or more profiled rows whose shapes separate them, the GEMM
   and the memory-bound efficiency by least squares of the profiled compute seconds per step (the
   compute time is linear in their inverses); otherwise one factor on both (from the profiled
   compute seconds, or - no profile - from the median step);
2. the all-to-all bandwidth inside the NVLink domain (``nvlink_alltoall_efficiency``: the share of
   the GPU kind's per-direction NVLink bandwidth) from the profiled all-to-all seconds per call
   (latency fixed, ``hardware.json``), from rows whose all-to-all stays inside one NVLink domain;
3. the scale-out (inter-node) all-to-all bandwidth (``scaleout_alltoall_efficiency``: the share of
   the GPU kind's NIC line rate) from the profiled all-to-all seconds per call of rows whose EP
   group spans NVLink domains (multi-node runs) and whose call the NIC part bounds (the NVLink part,
   at the bandwidth of step 2, is shorter); without such a row the default is kept and
   ``not_fitted`` says so.

It raises ``ValueError`` naming what is missing (no overlap-off row; a row the model cannot read).
``ClusterCalibration.save(path)`` / ``load(path)`` write and read the file (``SCHEMA``); ``load``
raises ``ValueError`` with one line for a file that is not one. ``calibration()`` is the shipped
calibration with the fitted values in place (``source``: the file; a fitted scale-out link is its
``links[SCALE_OUT]``), the value ``core.prediction.for_config(..., calibration=)`` and
``model.predict`` take; ``with_scale_out(cluster)`` is ``cluster`` with that link as its
``inter_link``. ``predicted_step(row, cluster, calibration)`` is the model's step for a measured row
(its variant's side: off or on). Stdlib only.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .calibrate import _golden, _lstsq2
from .costs import Calibration, default_calibration, gpu_spec, hardware, layer_costs
from .inputs import Cluster, LinkSpec, StepInputs
from .model import predict

SCHEMA = "mbridge-ep-overlap cluster calibration 1"
FITTED = ("gemm_efficiency", "memory_efficiency", "nvlink_alltoall_efficiency")
SCALE_OUT_FITTED = "scaleout_alltoall_efficiency"
"""Fitted only from multi-node rows; a file without it keeps the default scale-out link."""
SCALE_OUT = "scale-out"
"""The name of a fitted scale-out link in ``Calibration.links``."""
_HUGE = 1e12  # an efficiency so large its part of the compute time vanishes


@dataclass(frozen=True)
class MeasuredRow:
    id: str
    variant: str
    median_s: float
    finalized: dict[str, Any]
    profile: dict[str, Any] | None = None
    """``iterations``, ``compute_s``, ``a2a_s`` (bench ``--profile``), or None."""

    def per_step(self, key: str) -> float | None:
        if not self.profile or self.profile.get(key) is None:
            return None
        return float(self.profile[key]) / int(self.profile.get("iterations") or 1)


@dataclass(frozen=True)
class ClusterCalibration:
    gpu: str
    fitted: dict[str, float]
    cluster: dict[str, Any]
    rows: tuple[str, ...]
    """The ids of the rows fitted on."""
    how: tuple[str, ...] = ()
    """What was fitted from what, one line each."""
    not_fitted: tuple[str, ...] = ()
    errors: dict[str, float] = field(default_factory=dict)
    """Per row (overlap rows included): predicted / measured median step - 1, after the fit."""
    path: str = ""

    def calibration(self) -> Calibration:
        base = default_calibration()
        links = dict(base.links)
        if SCALE_OUT_FITTED in self.fitted:
            links[SCALE_OUT] = scale_out_link(self.gpu, self.fitted[SCALE_OUT_FITTED], base)
        return dataclasses.replace(base, gpu=self.gpu, source=self.path or "cluster calibration", links=links,
                                   **{k: self.fitted[k] for k in FITTED})

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "gpu": self.gpu, "fitted": self.fitted, "cluster": self.cluster,
                "rows": list(self.rows), "how": list(self.how), "not_fitted": list(self.not_fitted),
                "errors": self.errors}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ClusterCalibration":
        try:
            d = json.loads(Path(path).read_text())
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            raise ValueError(f"{path} is not JSON ({type(e).__name__})") from None
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise ValueError(f"{path} is not a cluster calibration (no \"schema\": {SCHEMA!r}; "
                             "write one with `mbridge-ep-overlap calibrate`)")
        fitted = d.get("fitted")
        if not isinstance(fitted, dict):
            raise ValueError(f"{path}: \"fitted\" is not an object")
        for k in (*FITTED, *([SCALE_OUT_FITTED] if SCALE_OUT_FITTED in fitted else [])):
            v = fitted.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{path}: fitted {k} = {v!r}; required a finite number > 0")
        gpu = d.get("gpu")
        try:
            gpu_spec(gpu if isinstance(gpu, str) else repr(gpu))
        except KeyError as e:
            raise ValueError(f"{path}: {e.args[0]}") from None
        keys = (*FITTED, *([SCALE_OUT_FITTED] if SCALE_OUT_FITTED in fitted else []))
        return cls(gpu=gpu, fitted={k: float(fitted[k]) for k in keys}, cluster=dict(d.get("cluster") or {}),
                   rows=tuple(d.get("rows") or ()), how=tuple(d.get("how") or ()),
                   not_fitted=tuple(d.get("not_fitted") or ()), errors=dict(d.get("errors") or {}), path=str(path))


def scale_out_link(gpu: str, efficiency: float, base: Calibration | None = None) -> LinkSpec:
    """The scale-out link at ``efficiency`` of the GPU kind's NIC line rate (latency as shipped)."""
    base = base or default_calibration()
    ib = hardware()["links"]["infiniband"]
    return LinkSpec(name=SCALE_OUT, bandwidth_GBps=gpu_spec(gpu)["nic_gbit_s"] / 8 * efficiency,
                    latency_s=ib["latency_s"], contention=base.ib_contention, comm_slowdown=base.ib_comm_slowdown)


def with_scale_out(cluster: Cluster, calibration: Calibration) -> Cluster:
    """``cluster`` with the calibration's fitted scale-out link as its ``inter_link`` (an explicit
    ``inter_link`` of the cluster wins); unchanged when none was fitted."""
    link = calibration.links.get(SCALE_OUT)
    if link is None or cluster.inter_link is not None:
        return cluster
    return dataclasses.replace(cluster, inter_link=link)


def predicted_step(row: MeasuredRow, cluster: Cluster, calibration: Calibration | None = None) -> float:
    """The model's step for ``row`` on ``cluster``: overlap off for an ``off`` row, else on."""
    cal = calibration or default_calibration()
    inputs = _inputs(row, cluster)
    p = predict(inputs, with_scale_out(cluster, cal), cal, dispatcher=inputs.dispatcher)
    return p.off_step_s if row.variant == "off" else p.on_step_s


def _inputs(row: MeasuredRow, cluster: Cluster) -> StepInputs:
    try:
        return StepInputs.from_summary(row.finalized, num_gpus=cluster.num_gpus)
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"row {row.id}: the model cannot read its finalized fields ({e})") from None


def _fit_scale_out(across: list[tuple[MeasuredRow, float]], inputs: dict[str, StepInputs], cluster: Cluster,
                   cal: Calibration, how: list[str], not_fitted: list[str]) -> tuple[Calibration, dict[str, float]]:
    """Step 3: the scale-out bandwidth from the rows whose all-to-all leaves the NVLink domain
    (``across``: row, measured seconds per call). Per call the model takes latency + the longer
    of the NVLink part and the NIC part; a row whose measured call is not longer than latency +
    its NVLink part says nothing about the NIC and is named. Returns the calibration with the
    fitted link (``links[SCALE_OUT]``) and the fitted value, or both unchanged."""
    ib = hardware()["links"]["infiniband"]
    nic = gpu_spec(cluster.gpu)["nic_gbit_s"] / 8
    obs = []
    for r, per_call in across:
        costs = layer_costs(inputs[r.id], cluster, cal).a2a
        nvlink_s = costs.bytes_intra / (nvlink_bandwidth(cluster, cal) * 1e9) if costs.bytes_intra else 0.0
        if per_call - ib["latency_s"] <= nvlink_s:
            not_fitted.append(f"row {r.id}: its all-to-all call ({per_call:.3g} s) is not longer than latency + its "
                              "NVLink part: it does not bound the scale-out link")
            continue
        obs.append((per_call - ib["latency_s"], costs.bytes_inter))
    if not obs:
        not_fitted.append(f"{SCALE_OUT_FITTED}: no profiled overlap-off row whose EP group spans NVLink domains "
                          f"(multi-node); kept the default (NCCL all-to-all at {ib['nccl_alltoall_efficiency']:.0%} "
                          f"of the {nic * 8:g} Gb/s NIC, hardware.json)")
        return cal, {}
    inv_bw = sum(b * t for t, b in obs) / sum(b * b for _, b in obs)
    eff = 1 / inv_bw / 1e9 / nic
    how.append(f"{SCALE_OUT_FITTED}: the profiled all-to-all seconds per call of {len(obs)} multi-node overlap-off "
               f"row(s), latency {ib['latency_s']:g} s fixed: {1 / inv_bw / 1e9:.1f} GB/s of the {nic:g} GB/s NIC")
    links = {**cal.links, SCALE_OUT: scale_out_link(cluster.gpu, eff, cal)}
    return dataclasses.replace(cal, links=links), {SCALE_OUT_FITTED: eff}


def nvlink_bandwidth(cluster: Cluster, cal: Calibration) -> float:
    """The NVLink all-to-all bandwidth (GB/s per direction) at the calibration's efficiency."""
    return gpu_spec(cluster.gpu)["nvlink_GBps_bidir"] / 2 * cal.nvlink_alltoall_efficiency


def fit_cluster(rows: Sequence[MeasuredRow], cluster: Cluster, start: Calibration | None = None) -> ClusterCalibration:
    """Refit the cluster inputs from ``rows`` measured on ``cluster`` (module docstring)."""
    base = dataclasses.replace(start or default_calibration(), gpu=cluster.gpu)
    offs = [r for r in rows if r.variant == "off"]
    if not offs:
        raise ValueError("no overlap-off row among the measured rows: the fit needs the runs with EP overlap off "
                         "(launch_slurm.py --variants off,... or bench)")
    inputs = {r.id: _inputs(r, cluster) for r in rows}
    how, not_fitted = [], []

    def compute_s(r: MeasuredRow, g: float, m: float) -> float:
        c = dataclasses.replace(base, gemm_efficiency=g, memory_efficiency=m)
        return predict(inputs[r.id], cluster, c, dispatcher=inputs[r.id].dispatcher).compute_s_per_step

    profiled = [r for r in offs if r.per_step("compute_s")]
    cal = base
    eq = [(compute_s(r, 1.0, _HUGE), compute_s(r, _HUGE, 1.0), r.per_step("compute_s")) for r in profiled]
    try:
        inv_g, inv_m = _lstsq2(eq) if len(eq) >= 2 else (0.0, 0.0)
    except ValueError:
        inv_g = inv_m = 0.0
    if inv_g > 0 and inv_m > 0:
        cal = dataclasses.replace(cal, gemm_efficiency=1 / inv_g, memory_efficiency=1 / inv_m)
        how.append(f"gemm_efficiency, memory_efficiency: least squares of the profiled compute seconds of {len(eq)} "
                   "overlap-off rows")
    elif eq:  # one factor on both: measured = predicted(base) / k
        pred = [compute_s(r, base.gemm_efficiency, base.memory_efficiency) for r in profiled]
        k = sum(p * p for p in pred) / sum(p * y for p, (_, _, y) in zip(pred, eq))
        cal = dataclasses.replace(cal, gemm_efficiency=base.gemm_efficiency * k,
                                  memory_efficiency=base.memory_efficiency * k)
        how.append(f"gemm_efficiency, memory_efficiency: one factor ({k:.4g}) from the profiled compute seconds of "
                   f"{len(eq)} overlap-off row(s) (their shapes do not separate the two)")

    # 2. the all-to-all inside the NVLink domain: per call, latency + bytes / bandwidth
    nv_peak = gpu_spec(cluster.gpu)["nvlink_GBps_bidir"] / 2
    links = hardware()["links"]
    lat = links["nvlink"]["latency_s"]
    obs, across = [], []
    for r in offs:
        a2a = r.per_step("a2a_s")
        if a2a is None:
            continue
        inp = inputs[r.id]
        if inp.pp != 1:
            not_fitted.append(f"row {r.id}: pipeline parallel (all-to-all calls per step not counted here)")
            continue
        per_call = a2a / (4 * inp.num_moe_layers * inp.num_microbatches)
        costs = layer_costs(inp, cluster, cal).a2a
        if costs.bytes_inter:
            across.append((r, per_call))  # step 3, once the NVLink bandwidth is known
        else:
            obs.append((per_call, costs.bytes_intra, r.id))
    if obs and sum(b * (t - lat) for t, b, _ in obs) > 0:
        inv_bw = sum(b * (t - lat) for t, b, _ in obs) / sum(b * b for _, b, _ in obs)
        cal = dataclasses.replace(cal, nvlink_alltoall_efficiency=1 / inv_bw / 1e9 / nv_peak)
        how.append(f"nvlink_alltoall_efficiency: the profiled all-to-all seconds per call of {len(obs)} overlap-off "
                   f"row(s), latency {lat:g} s fixed: {1 / inv_bw / 1e9:.1f} GB/s of {nv_peak:g} GB/s")
    else:
        not_fitted.append("nvlink_alltoall_efficiency: no profiled overlap-off row inside one NVLink domain (kept)")
    cal, fitted_out = _fit_scale_out(across, inputs, cluster, cal, how, not_fitted)

    if not profiled:  # median steps alone: one factor on the compute efficiencies
        def err(log_k: float) -> float:
            k = math.exp(log_k)
            c = dataclasses.replace(cal, gemm_efficiency=base.gemm_efficiency * k,
                                    memory_efficiency=base.memory_efficiency * k)
            return sum((predict(inputs[r.id], with_scale_out(cluster, c), c,
                                dispatcher=inputs[r.id].dispatcher).off_step_s / r.median_s - 1) ** 2 for r in offs)
        k = math.exp(_golden(err, math.log(0.05), math.log(20.0), tol=1e-6))
        cal = dataclasses.replace(cal, gemm_efficiency=base.gemm_efficiency * k,
                                  memory_efficiency=base.memory_efficiency * k)
        how.append(f"gemm_efficiency, memory_efficiency: one factor ({k:.4g}) from the median steps of {len(offs)} "
                   "overlap-off row(s) (no profile)")

    errors = {r.id: predicted_step(r, cluster, cal) / r.median_s - 1 for r in rows}
    return ClusterCalibration(
        gpu=cluster.gpu, fitted={**{k: getattr(cal, k) for k in FITTED}, **fitted_out},
        cluster={"gpu": cluster.gpu, "num_gpus": cluster.num_gpus, "gpus_per_node": cluster.gpus_per_node,
                 "nvlink_domain_size": cluster.nvlink_domain_size},
        rows=tuple(r.id for r in offs), how=tuple(how), not_fitted=tuple(not_fitted), errors=errors)
