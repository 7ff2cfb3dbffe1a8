"""Predicted step time with EP overlap off and on, for one finalized config on a target cluster.

Contract
--------
``predict(inputs, cluster, calibration=None, *, dispatcher=None) -> Prediction``:

* per-node costs from ``costs.layer_costs`` (FLOPs at the calibrated GEMM efficiency, bytes at
  the calibrated memory efficiency, all-to-all bytes over the cluster's links);
* overlap **off**: every microbatch's forward and backward run back to back, each all-to-all
  exposed (Megatron-Core's ``forward_backward_no_pipelining`` / 1F1B);
* overlap **on**: the two-stream replay of ``schedule.py`` (combined 1F1B as MCore 0.19.2 issues
  it: first forward and last backward unpaired, the per-layer pairing of
  ``TransformerLayerSchedulePlan.run``; contention, all-to-all slowdown and the default stream
  priority's start delay as calibrated, none of the delay with ``high_priority_a2a``); with PP > 1
  the interleaved schedule's warm-up
  (``2(pp-1) + (vpp-1) pp + 1`` unpaired forwards on the first stage, ``schedules.py:937-943``),
  its cool-down and the ``(pp-1)`` chunk bubble stay unpaired;
* both: + optimizer step + the exposed part of the DP gradient sync (per step, never hidden by
  EP overlap);
* ``Prediction``: off/on step seconds, speedup, share of the all-to-all hidden, all-to-all and
  compute seconds per step (overlap off), a breakdown and the inputs that were defaults.

With PP > 1 and no VPP Megatron-Core refuses overlap (``transformer_config.py:2674``): the
prediction then has ``supported=False`` and ``on_step_s == off_step_s``. ``ncclep`` has no
bandwidth model: ``predict`` raises ``NotModelled``; ``rank_dispatchers`` lists it with the reason.

A prediction is finite or not made: where it cannot be made - a model chunk of more than
``MAX_CHUNK_LAYERS`` layers (the replay simulates each layer), arithmetic out of range (a zero
bandwidth or efficiency in a custom ``Calibration`` / ``LinkSpec``), a non-finite result -
``predict`` raises ``OutsideModel`` (a ``ValueError``) with the reason, never ``OverflowError``,
``ZeroDivisionError`` or a ``Prediction`` holding ``inf`` / ``nan``. ``StepInputs`` already refuses
sizes no run can have (``inputs`` module docstring).

Stdlib only; a prediction takes a few milliseconds.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ..base.choices import MEASURED_DISPATCHERS
from .costs import Calibration, Costs, default_calibration, ep_layout, hardware, hybridep_published, layer_costs
from .inputs import DISPATCHERS, Cluster, StepInputs
from .schedule import microbatch_off, simulate_overlap, steady_overlap

MODELLED = MEASURED_DISPATCHERS
# Layers of one model chunk the replay simulates one by one (~1.4 ms each for all dispatchers): far
# above any real model (DeepSeek-V3 has 61 layers, Llama-3.1-405B 126), and a bound on its time.
MAX_CHUNK_LAYERS = 1024


class NotModelled(ValueError):
    """The dispatcher has no bandwidth model; ``reason`` says why."""

    def __init__(self, dispatcher: str, reason: str) -> None:
        super().__init__(f"{dispatcher}: {reason}")
        self.dispatcher = dispatcher
        self.reason = reason


class OutsideModel(ValueError):
    """No prediction can be made for these inputs (too large a chunk, arithmetic out of range, a
    non-finite result); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Prediction:
    dispatcher: str
    off_step_s: float
    on_step_s: float
    speedup: float
    hidden_fraction: float  # of the all-to-all time with overlap on, the share that coincides with compute
    a2a_s_per_step: float  # all-to-all seconds per step (overlap off: all exposed)
    compute_s_per_step: float  # compute seconds per step (overlap off, no contention)
    supported: bool = True
    breakdown: dict[str, float] = field(default_factory=dict)
    defaults_used: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_table(self) -> str:
        """A small markdown table (one row per quantity)."""
        rows = [
            ("dispatcher", self.dispatcher),
            ("step, overlap off", f"{self.off_step_s:.3f} s"),
            ("step, overlap on", f"{self.on_step_s:.3f} s" + ("" if self.supported else " (overlap not supported)")),
            ("speedup", f"{self.speedup:.3f}x"),
            ("all-to-all hidden (overlap on)", f"{100 * self.hidden_fraction:.0f}%"),
            ("all-to-all per step (overlap off)", f"{self.a2a_s_per_step:.3f} s"),
            ("compute per step (overlap off)", f"{self.compute_s_per_step:.3f} s"),
        ]
        rows += [(f"  {k}", f"{v:.4g}") for k, v in self.breakdown.items()]
        if self.defaults_used:
            rows.append(("defaults used", ", ".join(self.defaults_used)))
        rows += [("note", n) for n in self.notes]
        return "\n".join(["| quantity | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])


def _chunk_layers(inputs: StepInputs) -> tuple[list[str], float]:
    """Layer kinds of one representative model chunk and the factor from it to the real chunk.

    Without pipelining: every layer (dense first, MTP last). With PP/VPP: an average chunk of
    round(layers / chunks) layers, dense layers in proportion (MTP counted as a MoE layer), scaled
    back to the fractional real size - a balanced layout is assumed."""
    total = inputs.num_layers + inputs.mtp_num_layers
    chunks = inputs.pp * (inputs.vpp or 1)
    n = total if chunks == 1 else max(1, round(total / chunks))
    if n > MAX_CHUNK_LAYERS:
        raise OutsideModel(f"a model chunk of {n} layers: the replay simulates at most {MAX_CHUNK_LAYERS}")
    if chunks == 1:
        kinds = ["dense"] * inputs.num_dense_layers + ["moe"] * inputs.num_moe_layers + ["mtp"] * inputs.mtp_num_layers
        return kinds, 1.0
    per = total / chunks
    n_dense = min(n, round(inputs.num_dense_layers / chunks))
    return ["dense"] * n_dense + ["moe"] * (n - n_dense), per / n


def _with_recompute(c: Costs) -> Costs:
    """Full recompute: every backward first replays its layer's forward, all-to-alls included
    (they are exposed: the replay runs on the compute path right before the backward)."""
    return dataclasses.replace(
        c, attn_b=c.attn_b + c.attn_f + 2 * c.a2a.seconds, moe_pre_b=c.moe_pre_b + c.moe_pre_f,
        expert_b=c.expert_b + c.expert_f, dense_mlp_b=c.dense_mlp_b + c.dense_mlp_f,
        combine_post_b=c.combine_post_b + c.combine_post_f)


def predict(inputs: StepInputs, cluster: Cluster, calibration: Calibration | None = None, *,
            dispatcher: str | None = None, _no_stall: bool = False) -> Prediction:
    """Step time with overlap off and on (see the module docstring); finite, or ``OutsideModel``."""
    d = dispatcher or inputs.dispatcher
    if d not in DISPATCHERS:
        raise ValueError(f"dispatcher {d!r}: one of {DISPATCHERS}")
    if d not in MODELLED:
        raise NotModelled(d, hardware()["flex_dispatchers"][d]["not_modelled"])
    try:
        p = _predict(inputs, cluster, calibration or default_calibration(), d, _no_stall)
        numbers = {"off_step_s": p.off_step_s, "on_step_s": p.on_step_s, "speedup": p.speedup,
                   "hidden_fraction": p.hidden_fraction, "a2a_s_per_step": p.a2a_s_per_step,
                   "compute_s_per_step": p.compute_s_per_step, **p.breakdown}
        bad = [f"{k} = {v}" for k, v in numbers.items() if not math.isfinite(v)]
    except (OverflowError, ZeroDivisionError) as e:
        raise OutsideModel(f"arithmetic out of range ({type(e).__name__}: {e})") from None
    if bad:
        raise OutsideModel(f"non-finite result ({', '.join(bad[:3])})")
    return p


def _predict(inputs: StepInputs, cluster: Cluster, cal: Calibration, d: str, _no_stall: bool) -> Prediction:
    notes: list[str] = []
    if inputs.world_size != cluster.num_gpus:
        notes.append(f"tp x pp x cp x dp = {inputs.world_size} GPUs, the cluster has {cluster.num_gpus}")
    if cluster.gpu != cal.gpu:
        notes.append(f"efficiencies calibrated on {cal.gpu}, applied to {cluster.gpu}")
    c = layer_costs(inputs, cluster, cal, d)
    if inputs.recompute:
        c = _with_recompute(c)
        notes.append("full recompute: MCore 0.19.2 refuses it with overlap on (transformer_config.py:2689); "
                     "modelled as a per-layer forward replay with exposed all-to-alls (Megatron-LM #6311)")
    supported = inputs.ep > 1 and not (inputs.pp > 1 and inputs.vpp is None)
    if inputs.ep <= 1:
        notes.append("EP = 1: no expert-parallel all-to-all, nothing to overlap")
    if inputs.pp > 1 and inputs.vpp is None:
        notes.append("PP > 1 without VPP: MCore asserts when overlap is on (transformer_config.py:2674)")
    delay = 0.0 if inputs.high_priority_a2a else cal.stream_priority_delay

    m = inputs.num_microbatches
    layers, scale = _chunk_layers(inputs)
    n_moe_chunk = sum(1 for k in layers if k != "dense")
    host = c.host_per_microbatch
    sync_comm = d == "deepep"
    bd: dict[str, float] = {}
    if inputs.pp == 1:
        f_off, b_off, nonc = microbatch_off(c, layers)
        off = m * (f_off + b_off + host)
        a2a_step = m * 4 * n_moe_chunk * c.a2a.seconds
        compute_step = m * (f_off + b_off - nonc)
        bd["forward_s_per_microbatch"] = f_off
        bd["backward_s_per_microbatch"] = b_off
        if supported:
            r = steady_overlap(c, layers, m, sync_comm=sync_comm, delay=delay)
            on = r.makespan
            hidden = r.a2a_hidden / r.a2a_busy if r.a2a_busy else 0.0
            bd["overlap_compute_s"] = r.compute_busy
        else:
            on, hidden = off, 0.0
        exposed_end = f_off + b_off  # first forward + last backward run unpaired
        chunks, cooldown_s = 1, 0.0
    else:
        v = inputs.vpp or 1
        units = m * v
        chunks = v
        cn = dataclasses.replace(c, host_per_microbatch=0.0)
        f_u, b_u, nonc = microbatch_off(cn, layers, first_chunk=False, last_chunk=False)
        ends = (c.embed_f + c.embed_b + c.head_f + c.head_b) / (inputs.pp * v)  # balanced layout assumed
        U = (f_u + b_u) * scale + ends + 2 * c.pp_p2p
        off = units * U + (inputs.pp - 1) * U + m * host
        a2a_step = units * 4 * n_moe_chunk * c.a2a.seconds * scale
        compute_step = units * ((f_u + b_u - nonc) * scale + ends)
        bd["chunk_unit_s"] = U
        bd["bubble_s"] = (inputs.pp - 1) * U
        if supported:
            r5 = simulate_overlap(cn, layers, 5, first_chunk=False, last_chunk=False, sync_comm=sync_comm, delay=delay)
            r6 = simulate_overlap(cn, layers, 6, first_chunk=False, last_chunk=False, sync_comm=sync_comm, delay=delay)
            P = (r6.makespan - r5.makespan) * scale + ends + 2 * c.pp_p2p
            warm = min(units, 2 * (inputs.pp - 1) + (v - 1) * inputs.pp + 1)
            on = warm * U + (units - warm) * P + (inputs.pp - 1) * U + m * host
            pair_a2a = (r6.a2a_busy - r5.a2a_busy) * scale
            hid = (r6.a2a_hidden - r5.a2a_hidden) * scale * (units - warm)
            busy = pair_a2a * (units - warm) + 4 * n_moe_chunk * c.a2a.seconds * scale * warm
            hidden = hid / busy if busy else 0.0
            bd["pair_unit_s"] = P
            bd["unpaired_units"] = float(warm)
        else:
            on, hidden = off, 0.0
        exposed_end = U
        # the cool-down runs as many backward units as the warm-up ran forwards (schedules.py:937-943)
        cooldown_s = min(units, 2 * (inputs.pp - 1) + (v - 1) * inputs.pp + 1) * b_u * scale
    # per-step parts that EP overlap never hides. With overlap_grad_reduce the gradient sync of each
    # model chunk starts when that chunk's last backward is done (MCore 0.19.2 schedules.py:1418-1427,
    # 2036-2041): with VPP all but the last chunk's sync run beside the remaining cool-down backwards
    dp_exposed = c.dp_sync if not inputs.overlap_grad_reduce else max(
        0.0, max(c.dp_sync / chunks, c.dp_sync - cooldown_s) - exposed_end / 2)
    tail = c.optimizer + dp_exposed
    off += tail
    on += tail
    compute_step += c.optimizer
    if d == "hybridep" and c.a2a.bytes_intra and (published := hybridep_published(cluster.gpu, ep_layout(inputs, cluster)[0])):
        notes.append(f"hybridep inside the NVLink domain: {published[1]}")
    if d == "deepep" and not c.dispatch_sync_s and cal.deepep_dispatch_sync_s:
        notes.append("deepep beyond one 8-GPU NVLink group: published bandwidth model only; the host stall measured "
                     "with DeepEP's intranode kernels on 2x H200 is not applied (different kernels)")
    if c.dispatch_sync_s:
        notes.append(f"deepep: includes {1e3 * c.dispatch_sync_s:.1f} ms of host time after each dispatch's CPU wait, "
                     "measured with DeepEP's intranode kernels on 2x H200 (calibration.json); whether it holds "
                     "elsewhere is unknown - breakdown has the step times without it")
        if not _no_stall:
            alt = predict(inputs, cluster, dataclasses.replace(cal, deepep_dispatch_sync_s=0.0), dispatcher=d,
                          _no_stall=True)
            bd["off_step_s_without_dispatch_stall"] = alt.off_step_s
            bd["on_step_s_without_dispatch_stall"] = alt.on_step_s
    bd.update({
        "a2a_s_per_call": c.a2a.seconds, "a2a_bytes_per_call": c.a2a.bytes_total,
        "a2a_bytes_leaving_domain_per_call": c.a2a.bytes_inter, "host_s_per_step": m * host,
        "optimizer_s": c.optimizer, "dp_sync_exposed_s": dp_exposed,
    })
    return Prediction(
        dispatcher=d, off_step_s=off, on_step_s=on, speedup=off / on if on else 1.0,
        hidden_fraction=hidden, a2a_s_per_step=a2a_step, compute_s_per_step=compute_step,
        supported=supported, breakdown=bd, defaults_used=inputs.defaults_used, notes=tuple(notes))


def rank_dispatchers(inputs: StepInputs, cluster: Cluster, calibration: Calibration | None = None
                     ) -> list[tuple[str, Prediction | NotModelled]]:
    """Every dispatcher, best predicted step first (the better of overlap off / on counts); the
    ones without a bandwidth model come last, as ``NotModelled`` with the reason."""
    done: list[tuple[str, Prediction]] = []
    missing: list[tuple[str, NotModelled]] = []
    for d in DISPATCHERS:
        try:
            done.append((d, predict(inputs, cluster, calibration, dispatcher=d)))
        except NotModelled as e:
            missing.append((d, e))
    done.sort(key=lambda x: min(x[1].off_step_s, x[1].on_step_s))
    return [*done, *missing]
