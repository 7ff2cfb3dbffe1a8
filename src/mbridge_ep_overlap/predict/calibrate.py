"""Fit the step-time model's few free constants to bench measurements (``results.json`` rows).

Contract
--------
``load_rows(paths)`` reads bench ``results.json`` files into ``BenchRow``s (stable ids
``<folder>/<file>#<index>``). ``bench_inputs(row)`` / ``bench_cluster(row, calibration)`` rebuild
what a row ran: the ``qwen3_moe_proxy`` recipe (4 layers, 16 experts, 4 KV groups, vocab 32768,
local layers with grouped GEMM, EP=2, DP=2, bf16) with the row's ``finalized`` fields on top, and
for folders whose rows predate the shape fields the overrides of that run's ``benchmarks.md``
header (``EVIDENCE_SHAPES``). ``fit(rows, calibration_ids)`` fits, in this order and each from the
rows named in ``calibration_ids`` only:

1. ``gemm_efficiency`` and ``memory_efficiency`` - least squares of the profiled compute seconds
   per step of the overlap-off rows (compute time is linear in their inverses);
2. per link, the all-to-all bandwidth: NVLink as a fraction of the per-direction NVLink
   bandwidth, the throttled link (``NCCL_P2P_DISABLE=1``, host shared memory) in GB/s - from the
   profiled all-to-all seconds per step of the overlap-off rows (latency fixed, see
   ``hardware.json``: every bench shape moves the same bytes per call, so it is not identifiable);
3. the host stall per microbatch, ``a + b x (bytes of the dense attention mask)`` - from the
   overlap-off rows' median step minus the predicted GPU time;
4. per link, the compute slowdown while an all-to-all runs beside it (``contention``) - from the
   ratio of profiled compute seconds overlap on / off of the default-priority ``overlap`` rows;
5. the start delay of a default-priority all-to-all behind a running compute node
   (``stream_priority_delay``) and, per link, the all-to-all's own slowdown beside compute
   (``comm_slowdown``) - from the median step of those ``overlap`` rows (4 and 5 alternate three
   times: each changes the replay the other is fitted through);
6. DeepEP's host time per dispatch after its CPU wait - from the median step of the ``deepep``
   rows among the calibration rows.

Every fitted value starts from zero, so a re-fit does not depend on the file it replaces.
``python -m mbridge_ep_overlap.predict.calibrate FILES... --out calibration.json [--calibration-ids
ID...]`` writes a calibration file in the format of the shipped ``calibration.json``. Stdlib only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from .costs import Calibration, default_calibration, gpu_spec, hardware, layer_costs
from .inputs import Cluster, LinkSpec, StepInputs
from .model import predict
from .schedule import microbatch_off, steady_overlap

# The proxy recipe (recipes/proxy.py + target/hf_configs/mbridge-ep-overlap--qwen3-moe-proxy/config.json).
PROXY_RECIPE: dict[str, Any] = {
    "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "num_query_groups": 4,
    "kv_channels": 64, "num_moe_experts": 16, "moe_router_topk": 4, "moe_ffn_hidden_size": 512,
    "ffn_hidden_size": 2048, "num_dense_layers": 0, "vocab_size": 32768, "mtp_num_layers": 0,
    "transformer_impl": "local", "attention_mask_in_batch": True, "overlap_grad_reduce": True,
}
PROXY_GPUS = 2
# Folders whose rows lack the shape fields: the overrides of the run (its benchmarks.md header).
EVIDENCE_SHAPES: dict[str, dict[str, Any]] = {
    "2026-11-30-h200x2-bench": {"hidden_size": 2048, "moe_ffn_hidden_size": 1536, "moe_router_topk": 8, "num_attention_heads": 16},
}
# The rows the shipped calibration was fitted on: the comm-bound shape of the 2026-11-30 first 2x H200 run
# (16 microbatches) and the long-seq shape with expert FFN 3072 of the 2026-11-30 long-seq run. Every other
# shape (balanced, long-seq FFN 1536) is validation only.
DEFAULT_CALIBRATION_IDS: tuple[str, ...] = (
    "2026-11-30-h200x2-bench/results.json#0",  # comm-bound, throttled, off
    "2026-11-30-h200x2-bench/results.json#1",  # comm-bound, throttled, overlap
    "2026-11-30-h200x2-bench/results.json#3",  # comm-bound, nvlink, off
    "2026-11-30-h200x2-bench/results.json#4",  # comm-bound, nvlink, overlap
    "2026-11-30-h200x2-bench-long-seq/results.json#0",  # long-seq ffn3072, throttled, off
    "2026-11-30-h200x2-bench-long-seq/results.json#2",  # long-seq ffn3072, throttled, overlap
    "2026-11-30-h200x2-bench-long-seq/results.json#3",  # long-seq ffn3072, throttled, off (repeat)
    "2026-11-30-h200x2-bench-long-seq/results.json#4",  # long-seq ffn3072, throttled, overlap (repeat)
    "2026-11-30-h200x2-bench-long-seq/results.json#6",  # long-seq ffn3072, nvlink, off
    "2026-11-30-h200x2-bench-long-seq/results.json#7",  # long-seq ffn3072, nvlink, overlap
    "2026-11-30-h200x2-bench-long-seq/results.json#10",  # long-seq ffn3072, nvlink, deepep (DeepEP's dispatch stall)
)
VARIANT_DISPATCHER = {"off": "alltoall", "overlap": "alltoall", "overlap:hiprio": "alltoall",
                      "deepep": "deepep", "hybridep": "hybridep"}
NOT_MODELLED_VARIANTS = {
    "overlap:cdmc1": "CUDA_DEVICE_MAX_CONNECTIONS=1 serialises the two streams in one hardware queue; not modelled",
    "overlap+delay_wgrad": "delayed wgrad is not modelled",
}


@dataclass(frozen=True)
class BenchRow:
    id: str
    folder: str
    index: int
    link: str
    variant: str
    median_s: float
    speedup: float | None
    finalized: dict[str, Any]
    profile: dict[str, Any] | None

    @property
    def iterations(self) -> int:
        return int((self.profile or {}).get("iterations") or 1)

    def per_step(self, key: str) -> float | None:
        if not self.profile or self.profile.get(key) is None:
            return None
        return float(self.profile[key]) / self.iterations

    @property
    def shape(self) -> str:
        i = bench_inputs(self)
        return (f"h{i.hidden_size} attn{i.num_attention_heads}x{i.kv_channels} ffn{i.moe_ffn_hidden_size} "
                f"top{i.moe_router_topk}/{i.num_moe_experts} mbs{i.micro_batch_size} seq{i.seq_length} "
                f"mb{i.num_microbatches}")


def load_rows(paths: Iterable[str | Path]) -> list[BenchRow]:
    """Rows of bench ``results.json`` files (failed rows skipped)."""
    out: list[BenchRow] = []
    for path in paths:
        p = Path(path)
        for idx, r in enumerate(json.loads(p.read_text())):
            if not r.get("ok") or r.get("median_s") is None:
                continue
            out.append(BenchRow(id=f"{p.parent.name}/{p.name}#{idx}", folder=p.parent.name, index=idx,
                                link=r["link"], variant=r["variant"], median_s=float(r["median_s"]),
                                speedup=r.get("speedup"), finalized=dict(r.get("finalized") or {}),
                                profile=r.get("overlap_efficiency")))
    return out


def bench_inputs(row: BenchRow) -> StepInputs:
    """What the row ran (see the module docstring)."""
    s = dict(PROXY_RECIPE)
    s.update(EVIDENCE_SHAPES.get(row.folder, {}))
    s.update({k: v for k, v in row.finalized.items() if v is not None})
    s["dispatcher"] = VARIANT_DISPATCHER.get(row.variant, "alltoall")
    s["high_priority_a2a_comm_stream"] = row.variant == "overlap:hiprio"
    return StepInputs.from_summary(s, num_gpus=PROXY_GPUS)


def bench_cluster(row: BenchRow, cal: Calibration) -> Cluster:
    """2x H200 in one NVLink domain; the throttled link replaces NVLink for NCCL traffic."""
    intra = cal.links.get("throttled") if row.link == "throttled" else None
    return Cluster(gpu=cal.gpu, num_gpus=PROXY_GPUS, gpus_per_node=PROXY_GPUS, nvlink_domain_size=PROXY_GPUS,
                   intra_link=intra)


def predicted_for(row: BenchRow, cal: Calibration):
    """The prediction that corresponds to the row's variant, or None (not modelled)."""
    if row.variant in NOT_MODELLED_VARIANTS:
        return None
    inp = bench_inputs(row)
    return predict(inp, bench_cluster(row, cal), cal, dispatcher=inp.dispatcher)


# ----------------------------------------------------------------------------------------------
def _lstsq2(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of y = a*x1 + b*x2 (no intercept)."""
    s11 = sum(x1 * x1 for x1, _, _ in rows)
    s22 = sum(x2 * x2 for _, x2, _ in rows)
    s12 = sum(x1 * x2 for x1, x2, _ in rows)
    t1 = sum(x1 * y for x1, _, y in rows)
    t2 = sum(x2 * y for _, x2, y in rows)
    det = s11 * s22 - s12 * s12
    if abs(det) < 1e-30:
        raise ValueError("calibration rows do not separate the two parameters (need two distinct shapes)")
    return (t1 * s22 - t2 * s12) / det, (s11 * t2 - s12 * t1) / det


def _golden(f, lo: float, hi: float, tol: float = 1e-4) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def _calibration_dict(cal: Calibration) -> dict[str, Any]:
    return {
        "gemm_efficiency": cal.gemm_efficiency, "memory_efficiency": cal.memory_efficiency,
        "nvlink_alltoall_efficiency": cal.nvlink_alltoall_efficiency, "nvlink_contention": cal.nvlink_contention,
        "nvlink_comm_slowdown": cal.nvlink_comm_slowdown,
        "links": {n: {"bandwidth_GBps": link.bandwidth_GBps, "latency_s": link.latency_s, "contention": link.contention,
                      "comm_slowdown": link.comm_slowdown} for n, link in cal.links.items()},
        "host_s_per_microbatch": cal.host_s_per_microbatch, "host_s_per_mask_byte": cal.host_s_per_mask_byte,
        "stream_priority_delay": cal.stream_priority_delay,
        "deepep_dispatch_sync_s": cal.deepep_dispatch_sync_s,
    }


def fit(rows: Sequence[BenchRow], calibration_ids: Sequence[str] = DEFAULT_CALIBRATION_IDS,
        start: Calibration | None = None) -> Calibration:
    """Fit the free constants from the rows named in ``calibration_ids`` (module docstring)."""
    base = start or default_calibration()
    use = [r for r in rows if r.id in set(calibration_ids)]
    missing = set(calibration_ids) - {r.id for r in use}
    if missing:
        raise KeyError(f"calibration rows not found: {sorted(missing)}")
    offs = [r for r in use if r.variant == "off" and r.profile]
    ons = [r for r in use if r.variant == "overlap" and r.profile]
    lat_thr = base.links["throttled"].latency_s if "throttled" in base.links else 3e-5
    # start from nothing fitted: the result must not depend on the file it replaces
    cal = dataclasses.replace(
        base, gemm_efficiency=0.5, memory_efficiency=0.5, nvlink_alltoall_efficiency=0.5, nvlink_contention=0.0,
        nvlink_comm_slowdown=0.0, host_s_per_microbatch=0.0, host_s_per_mask_byte=0.0, stream_priority_delay=0.0,
        deepep_dispatch_sync_s=0.0,
        links={n: dataclasses.replace(link, contention=0.0, comm_slowdown=0.0) for n, link in base.links.items()})

    # 1. compute: time = A / gemm_eff + B / mem_eff
    big = 1e12

    def compute_parts(r: BenchRow) -> tuple[float, float]:
        out = []
        for eg, em in ((1.0, big), (big, 1.0)):
            c = dataclasses.replace(cal, gemm_efficiency=eg, memory_efficiency=em)
            p = predict(bench_inputs(r), bench_cluster(r, c), c, dispatcher="alltoall")
            out.append(p.compute_s_per_step)
        return out[0], out[1]

    eq = []
    for r in offs:
        a, b = compute_parts(r)
        eq.append((a, b, r.per_step("compute_s")))
    x, y = _lstsq2(eq)
    cal = dataclasses.replace(cal, gemm_efficiency=1 / x, memory_efficiency=1 / y)

    # 2. links: per-call time = latency + bytes / bandwidth
    nv_peak = gpu_spec(cal.gpu)["nvlink_GBps_bidir"] / 2
    lat_nv = hardware()["links"]["nvlink"]["latency_s"]
    per_link: dict[str, list[tuple[float, float]]] = {}
    for r in offs:
        inp = bench_inputs(r)
        calls = 4 * inp.num_moe_layers * inp.num_microbatches
        t = r.per_step("a2a_s") / calls
        per_link.setdefault(r.link, []).append((t, layer_costs(inp, bench_cluster(r, cal), cal).a2a.bytes_intra))
    links = dict(cal.links)
    nv_eff = cal.nvlink_alltoall_efficiency
    for link, obs in per_link.items():
        lat = lat_thr if link == "throttled" else lat_nv
        inv_bw = sum(by * (t - lat) for t, by in obs) / sum(by * by for _, by in obs)  # s per byte
        bw = 1 / inv_bw / 1e9
        if link == "throttled":
            old = links.get("throttled")
            links["throttled"] = LinkSpec(name="throttled", bandwidth_GBps=bw, latency_s=lat,
                                          contention=old.contention if old else 0.0,
                                          comm_slowdown=old.comm_slowdown if old else 0.0)
        elif link == "nvlink":
            nv_eff = bw / nv_peak
    cal = dataclasses.replace(cal, links=links, nvlink_alltoall_efficiency=nv_eff)

    # 3. host stall per microbatch = a + b * mask bytes
    eq3 = []
    for r in offs:
        inp = bench_inputs(r)
        c0 = dataclasses.replace(cal, host_s_per_microbatch=0.0, host_s_per_mask_byte=0.0)
        p = predict(inp, bench_cluster(r, c0), c0, dispatcher="alltoall")
        resid = (r.median_s - p.off_step_s) / inp.num_microbatches
        mask = inp.micro_batch_size * inp.seq_length ** 2 if inp.attention_mask_in_batch else 0
        eq3.append((1.0, float(mask), resid))
    a, b = _lstsq2(eq3)
    cal = dataclasses.replace(cal, host_s_per_microbatch=max(0.0, a), host_s_per_mask_byte=max(0.0, b))

    # 4 + 5, alternated until stable (each depends on the other through the replay):
    # 4. per link, the compute slowdown beside an all-to-all (contention), from the ratio of
    #    profiled compute seconds overlap on / off (same run's off row);
    # 5. the default-priority start delay and, per link, the all-to-all slowdown beside compute,
    #    from the median step of the overlap rows (relative error), coordinate descent.
    def ratio_pred(r: BenchRow, c: Calibration) -> float:
        inp = bench_inputs(r)
        cc = layer_costs(inp, bench_cluster(r, c), c)
        layers = ["moe"] * inp.num_moe_layers
        f, bw, nonc = microbatch_off(cc, layers)
        off_c = inp.num_microbatches * (f + bw - nonc)
        on_c = steady_overlap(cc, layers, inp.num_microbatches, delay=c.stream_priority_delay).compute_busy
        return on_c / off_c

    def partner_off(r: BenchRow) -> BenchRow | None:
        key = bench_inputs(r).with_(dispatcher="alltoall", high_priority_a2a=False)
        cands = [o for o in rows if o.folder == r.folder and o.link == r.link and o.variant == "off"
                 and o.index < r.index and o.profile
                 and bench_inputs(o).with_(dispatcher="alltoall", high_priority_a2a=False) == key]
        return max(cands, key=lambda o: o.index) if cands else None

    def err5(c: Calibration) -> float:
        return sum((predict(bench_inputs(r), bench_cluster(r, c), c).on_step_s / r.median_s - 1) ** 2 for r in ons)

    links_on = sorted({r.link for r in ons})
    ratios = {link: [(r, r.per_step("compute_s") / partner_off(r).per_step("compute_s"))
                     for r in ons if r.link == link and partner_off(r) is not None] for link in links_on}
    for _ in range(3):
        for link in links_on:
            obs = ratios[link]
            if obs:
                def err4(k: float, link: str = link, obs=obs) -> float:
                    c = _with_link(cal, link, "contention", k)
                    return sum((ratio_pred(r, c) - meas) ** 2 for r, meas in obs)

                cal = _with_link(cal, link, "contention", _golden(err4, 0.0, 1.5, 1e-3))
        if ons:
            cal = dataclasses.replace(cal, stream_priority_delay=_golden(
                lambda x: err5(dataclasses.replace(cal, stream_priority_delay=x)), 0.0, 1.0, 1e-3))
            for link in links_on:
                best = _golden(lambda x, link=link: err5(_with_link(cal, link, "comm_slowdown", x)), 0.0, 5.0, 1e-3)
                cal = _with_link(cal, link, "comm_slowdown", best)

    # 6. DeepEP: host time per dispatch after its CPU wait, from the step time of the deepep rows
    deep = [r for r in use if r.variant == "deepep"]
    if deep:
        def err6(x: float) -> float:
            c = dataclasses.replace(cal, deepep_dispatch_sync_s=x)
            return sum((predicted_for(r, c).on_step_s / r.median_s - 1) ** 2 for r in deep)

        cal = dataclasses.replace(cal, deepep_dispatch_sync_s=_golden(err6, 0.0, 0.05, 1e-6))
    return cal


def _with_link(cal: Calibration, link: str, name: str, value: float) -> Calibration:
    """``cal`` with one link's ``contention`` or ``comm_slowdown`` replaced (NVLink's live on the
    calibration itself, a named link's in ``links``)."""
    if link == "nvlink":
        return dataclasses.replace(cal, **{f"nvlink_{name}": value})
    links = dict(cal.links)
    links[link] = dataclasses.replace(links[link], **{name: value})
    return dataclasses.replace(cal, links=links)


def calibration_file(cal: Calibration, rows: Sequence[BenchRow], calibration_ids: Sequence[str],
                     sources: Sequence[str]) -> dict[str, Any]:
    """The JSON document written by the CLI (and shipped as ``calibration.json``)."""
    ids = set(calibration_ids)
    resid = []
    for r in rows:
        if r.id not in ids:
            continue
        p = predicted_for(r, cal)
        pred = p.off_step_s if r.variant == "off" else p.on_step_s
        resid.append({"row": r.id, "link": r.link, "variant": r.variant, "measured_step_s": round(r.median_s, 4),
                      "predicted_step_s": round(pred, 4), "error": round(pred / r.median_s - 1, 4)})
    shipped = json.loads((Path(__file__).with_name("calibration.json")).read_text())
    return {
        "schema": 1,
        "gpu": cal.gpu,
        "how_measured": shipped.get("how_measured", {}),
        "fitted_from": {"files": [_rel(x) for x in sources], "calibration_rows": list(calibration_ids),
                        "validation_rows": [r.id for r in rows if r.id not in ids]},
        "fitted": _round(_calibration_dict(cal)),
        "assumed": shipped.get("assumed", {}),
        "calibration_row_residuals": resid,
    }


def _rel(path: str) -> str:
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        parts = p.parts
        return str(Path(*parts[parts.index("docs"):])) if "docs" in parts else str(p)


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mbridge_ep_overlap.predict.calibrate",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="bench results.json files")
    ap.add_argument("--out", required=True, help="calibration JSON to write")
    ap.add_argument("--calibration-ids", nargs="*", default=list(DEFAULT_CALIBRATION_IDS),
                    help="row ids (<folder>/<file>#<index>) to fit on; every other row is validation")
    a = ap.parse_args(argv)
    rows = load_rows(a.files)
    cal = fit(rows, a.calibration_ids)
    doc = calibration_file(cal, rows, a.calibration_ids, a.files)
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["fitted"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
