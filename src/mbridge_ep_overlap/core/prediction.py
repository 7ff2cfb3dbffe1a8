"""The prediction for one Megatron-Bridge config on a described target: what ``plan``, the advice
rules and ``dispatcher="auto"`` read.

Contract
--------
* ``cluster_for(target)`` - the ``Cluster`` of a ``ClusterEnvironment`` (GPU kind through
  ``base.gpus.match``, world size, GPUs per node, NVLink domain) and what about it is assumed
  (the scale-out link, when the job leaves one NVLink domain); ``CannotPredict`` when the GPU or
  the world size is unknown or the GPU kind has no hardware model (``hardware.json``).
* ``for_config(cfg, target, *, precision=None, dispatcher=None, assume=None, calibration=None)`` ->
  ``ConfigPrediction``: with ``calibration`` (a ``Calibration``; None: the shipped one; a fitted
  scale-out link in its ``links`` is the cluster's inter-node link), the config's inputs
  (``prediction_inputs.from_config``), the prediction for its
  dispatcher (or ``dispatcher``) and every dispatcher ranked (``model.rank_dispatchers``), with
  ``lines()`` for ``plan`` and ``to_dict()`` for its JSON (every number in it finite); every
  failure to predict (unknown GPU, a config the model does not cover - malformed or out-of-range
  values, sizes no run can have, arithmetic out of range -, a dispatcher without a bandwidth model)
  is ``CannotPredict`` with the reason, never another exception.
* What the model does not represent (``unmodelled(cfg, inputs, gpu)``): CUDA graphs, the replay time of a
  selectively recomputed "moe" or "gdn_norm_out" (the other modules' replay is costed), shared-expert overlap, BF16 first/last layers, TF32 GEMMs,
  FP8 attention on a GPU kind whose FP8 attention was not measured (``hardware.json`` ``fp8_attention``),
  attention sinks (a ``softmax_type`` other than vanilla on TE layers: their fused attention is not measured);
  each is one "not modelled: ..." line of ``lines()`` and lowers ``confidence`` from "validated"
  (BF16 on the calibrated GPU kind, ``validation``'s check rows) to "provisional" (another GPU kind or
  an FP8-class precision whose efficiency is not yet measured) or "low" (anything not modelled).
  Hybrid Mamba models (``hybrid_layer_pattern`` / ``hybrid_override_pattern`` with Mamba layers) are
  refused: ``CannotPredict`` says why - the model has no Mamba layer and never counts one as attention.
* The adapter between a config and ``predict``'s pure model: it reads the config object and the
  target, ``predict`` only plain values (``StepInputs``, ``Cluster``).
* The advice thresholds: overlap is worth keeping when its predicted speedup is at least
  ``MIN_GAIN``; another dispatcher is *clearly* faster when its predicted step is shorter by more
  than ``CLEAR_MARGIN`` (the model's stated accuracy on step time, ``validation.TARGET``).
  ``little_gain`` / ``clearly_faster`` apply them and return the text the rules quote.

Stdlib only (``base.sizes`` and ``base.gpus`` are plain data and arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..base.gpus import match
from ..predict.cluster_calibration import SCALE_OUT, with_scale_out
from ..predict.costs import REPLAYED_MODULES, Calibration, domain_size, fp8_attention, fp8_attention_measured, hardware
from ..predict.inputs import Cluster, StepInputs
from ..predict import memory
from ..predict.costs import linear_rate
from ..predict.model import NotModelled, OutsideModel, Prediction, rank_dispatchers
from ..predict.validation import TARGET
from .prediction_inputs import from_config, memory_options

MIN_GAIN = 1.03  # predicted overlap speedup below this: at best a few percent, within the model's error
CLEAR_MARGIN = TARGET  # another dispatcher predicted more than 10% faster: outside the model's error


class CannotPredict(ValueError):
    """No prediction for this config on this target; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def secs(x: float) -> str:
    """Seconds for people: ``29.98 s``, ``35.2 ms``."""
    return f"{x:.2f} s" if x >= 1 else f"{1e3 * x:.1f} ms"


def step_s(p: Prediction) -> float:
    """The step a dispatcher can reach: the better of overlap off and on (``rank_dispatchers``'s key)."""
    return min(p.off_step_s, p.on_step_s)


@dataclass(frozen=True)
class ConfigPrediction:
    inputs: StepInputs
    cluster: Cluster
    prediction: Prediction  # the config's dispatcher
    ranking: tuple[tuple[str, Prediction | NotModelled], ...]  # every dispatcher, best first
    assumed: tuple[str, ...] = ()  # the cluster's assumed parts (links the target does not describe)
    not_modelled: tuple[str, ...] = ()  # what the config uses that the model does not represent
    memory: Any = None  # memory.MemoryPrediction (None: not made, ``memory_error`` says why)
    memory_error: str | None = None

    @property
    def confidence(self) -> str:
        """'validated', 'provisional' or 'low' (module docstring), with the reason after a colon."""
        if self.not_modelled:
            return "low: the config uses what the model does not represent"
        why = []
        if self.cluster.gpu not in ("h100", "h200"):
            why.append(f"efficiencies measured on Hopper, applied to {self.cluster.gpu}")
        try:
            if linear_rate(self.inputs, self.cluster).provisional:
                why.append(f"{self.inputs.gemm_precision} GEMM efficiency provisional (hardware.json precisions)")
        except ValueError:
            pass
        return "provisional: " + "; ".join(why) if why else "validated: BF16 on Hopper (docs/prediction.md)"

    @property
    def defaults_used(self) -> tuple[str, ...]:
        return (*self.inputs.defaults_used, *self.assumed)

    def predicted(self, among: Iterable[str] | None = None) -> list[tuple[str, Prediction]]:
        """The modelled dispatchers (only those in ``among`` when given), best first."""
        keep = None if among is None else set(among)
        return [(d, p) for d, p in self.ranking if isinstance(p, Prediction) and (keep is None or d in keep)]

    def to_dict(self) -> dict[str, Any]:
        p = self.prediction
        return {
            "dispatcher": p.dispatcher, "gpu": self.cluster.gpu, "num_gpus": self.cluster.num_gpus,
            "off_step_s": p.off_step_s, "on_step_s": p.on_step_s, "speedup": p.speedup,
            "hidden_fraction": p.hidden_fraction, "supported": p.supported,
            "a2a_s_per_step": p.a2a_s_per_step, "compute_s_per_step": p.compute_s_per_step,
            "defaults_used": list(self.defaults_used), "notes": list(p.notes),
            "gemm_precision": self.inputs.gemm_precision, "confidence": self.confidence,
            "not_modelled": list(self.not_modelled),
            "memory": self.memory.to_dict() if self.memory is not None else {"error": self.memory_error},
            "dispatchers": [{"dispatcher": d, "off_step_s": x.off_step_s, "on_step_s": x.on_step_s,
                             "speedup": x.speedup} if isinstance(x, Prediction)
                            else {"dispatcher": d, "not_modelled": x.reason} for d, x in self.ranking],
        }

    def lines(self) -> list[str]:
        p = self.prediction
        on = secs(p.on_step_s) + ("" if p.supported else " (overlap not supported here)")
        out = [f"  dispatcher          : {p.dispatcher}, {self.cluster.num_gpus}x {self.cluster.gpu}",
               f"  GEMM precision      : {self.inputs.gemm_precision} (activations and all-to-all in BF16)",
               f"  step, overlap off   : {secs(p.off_step_s)}",
               f"  step, overlap on    : {on}",
               f"  speedup             : {p.speedup:.3f}x",
               f"  all-to-all hidden   : {100 * p.hidden_fraction:.0f}% (overlap on)"]
        others = [f"{d} {secs(x.off_step_s)} off / {secs(x.on_step_s)} on ({x.speedup:.2f}x)"
                  for d, x in self.predicted() if d != p.dispatcher]
        if others:
            out.append(f"  other dispatchers   : {'; '.join(others)}")
        out.append(f"  defaults used       : {', '.join(self.defaults_used) or 'none'}")
        out += [f"  note                : {n}" for n in p.notes]
        out += [f"  not modelled        : {n}" for n in self.not_modelled]
        out.append(f"  confidence          : {self.confidence}")
        if self.memory is not None:
            out += self.memory.lines()
        else:
            out.append(f"  memory per GPU      : not predicted ({self.memory_error})")
        return out


def cluster_for(target: Any) -> tuple[Cluster, tuple[str, ...]]:
    """(the ``Cluster`` of a ``ClusterEnvironment``, what about it is assumed)."""
    gpu = match(getattr(target, "gpu_name", None))
    if gpu is None:
        raise CannotPredict(f"GPU {getattr(target, 'gpu_name', None) or 'unknown'}: not in the GPU catalogue")
    if gpu.key not in hardware()["gpus"]:
        raise CannotPredict(f"no hardware model for {gpu.key} (modelled: {', '.join(sorted(hardware()['gpus']))})")
    world = getattr(target, "world_size", None)
    if not world:
        raise CannotPredict("world size unknown")
    cluster = Cluster(gpu=gpu.key, num_gpus=world, gpus_per_node=getattr(target, "gpus_per_node", None),
                      nvlink_domain_size=getattr(target, "nvlink_domain_size", None))
    assumed = ()
    if world > domain_size(cluster):
        nic = hardware()["gpus"][gpu.key]["nic_gbit_s"]
        eff = hardware()["links"]["infiniband"]["nccl_alltoall_efficiency"]
        assumed = (f"scale-out link ({nic} Gb/s NIC per GPU, NCCL all-to-all at {eff:.0%} of line rate)",)
    return cluster, assumed


_CONFIG_ERRORS = (KeyError, ValueError, TypeError, AttributeError, ArithmeticError)  # Overflow-, ZeroDivisionError


def for_config(cfg: Any, target: Any, *, precision: str | None = None, dispatcher: str | None = None,
               assume: Mapping[str, Any] | None = None, calibration: Calibration | None = None) -> ConfigPrediction:
    """The prediction for ``cfg`` on ``target`` (module docstring); ``CannotPredict`` otherwise."""
    cluster, assumed = cluster_for(target)
    if calibration is not None and SCALE_OUT in calibration.links and assumed:
        cluster = with_scale_out(cluster, calibration)
        assumed = (f"scale-out link as calibrated ({cluster.inter_link.bandwidth_GBps:.1f} GB/s per GPU)",)
    hybrid = hybrid_layers(cfg)
    if hybrid:
        raise CannotPredict(hybrid)
    try:
        inputs = from_config(cfg, cluster.num_gpus, precision=precision, dispatcher=dispatcher, assume=assume)
        ranking = tuple(rank_dispatchers(inputs, cluster, calibration))
    except OutsideModel as e:
        raise CannotPredict(f"the config is outside the model ({e.reason})") from None
    except _CONFIG_ERRORS as e:
        raise CannotPredict(f"the config is outside the model ({type(e).__name__}: {_first_line(e)})") from None
    own = dict(ranking)[inputs.dispatcher]
    if isinstance(own, NotModelled):
        raise CannotPredict(own.reason)
    mem, mem_error = None, None
    try:
        mem = memory.predict_memory(inputs, cluster, memory_options(cfg))
    except _CONFIG_ERRORS as e:
        mem_error = _first_line(e)
    return ConfigPrediction(inputs, cluster, own, ranking, assumed, unmodelled(cfg, inputs, cluster.gpu), mem, mem_error)


def memory_for_config(cfg: Any, target: Any, *, precision: str | None = None) -> memory.MemoryPrediction:
    """The peak memory per GPU of ``cfg`` on ``target`` (``memory.predict_memory``), for any dispatcher
    (it needs no bandwidth model); ``CannotPredict`` with the reason otherwise."""
    cluster, _ = cluster_for(target)
    hybrid = hybrid_layers(cfg)
    if hybrid:
        raise CannotPredict(hybrid)
    try:
        inputs = from_config(cfg, cluster.num_gpus, precision=precision)
        return memory.predict_memory(inputs, cluster, memory_options(cfg))
    except _CONFIG_ERRORS as e:
        raise CannotPredict(f"the config is outside the model ({type(e).__name__}: {_first_line(e)})") from None


def hybrid_layers(cfg: Any) -> str | None:
    """Why a hybrid Mamba model gets no prediction (None: not one). MCore's symbols: M Mamba,
    * attention, - MLP, E MoE (``ssm/mamba_hybrid_layer_allocation.Symbols``)."""
    model = getattr(cfg, "model", None)
    for name in ("hybrid_layer_pattern", "hybrid_override_pattern"):
        pattern = getattr(model, name, None)
        if isinstance(pattern, str) and "M" in pattern:
            counts = {sym: pattern.count(sym) for sym in "M*-E"}
            return (f"hybrid Mamba model (model.{name}: {counts['M']} Mamba, {counts['*']} attention, "
                    f"{counts['E']} MoE, {counts['-']} MLP layers): the step-time and memory model has no Mamba "
                    "layer, so no prediction is made (never counted as attention layers)")
    return None


def unmodelled(cfg: Any, inputs: StepInputs, gpu: str) -> tuple[str, ...]:
    """What ``cfg`` uses that the model does not represent on ``gpu`` (module docstring), one line each."""
    model = getattr(cfg, "model", None)
    get = lambda name, default=None: getattr(model, name, default)  # noqa: E731
    out = []
    impl = get("cuda_graph_impl", "none") or "none"
    if impl != "none":
        scope = get("cuda_graph_scope")
        out.append(f"CUDA graphs (cuda_graph_impl={impl}{f', scope {scope}' if scope else ''}): the launch time "
                   "they save (their buffers are estimated in memory)")
    unreplayed = [m for m in inputs.recompute_modules if m not in REPLAYED_MODULES]
    if unreplayed:
        out.append(f"selective recompute of {unreplayed}: its replay time (memory is modelled)")
    if get("moe_shared_expert_overlap"):
        out.append("moe_shared_expert_overlap: the shared expert on the communication stream")
    mp = getattr(cfg, "mixed_precision", None)
    if getattr(mp, "first_last_layers_bf16", False):
        out.append("first_last_layers_bf16: the first and last layers' BF16 GEMMs (all taken in "
                   f"{inputs.gemm_precision})")
    if inputs.gemm_precision == "fp32":
        out.append("FP32 (TF32) GEMMs: taken at the BF16 rate")
    measured = fp8_attention()
    if inputs.fp8_attention and not fp8_attention_measured(inputs, gpu):
        out.append(f"fp8_dot_product_attention: FP8 core attention ({inputs.gemm_precision} on {gpu}) taken at the BF16 "
                   f"rate (measured on H200 under {', '.join(measured['recipes'])} only, "
                   f"{measured['time_factor']:.2f}x the BF16 time there)")
    softmax = get("softmax_type", "vanilla") or "vanilla"
    if softmax != "vanilla" and inputs.transformer_impl == "transformer_engine":
        out.append(f"softmax_type={softmax} (attention sinks): fused attention with softmax offsets taken at the "
                   "measured speed of standard softmax")
    if get("moe_expert_capacity_factor") is not None:
        out.append(f"moe_expert_capacity_factor={get('moe_expert_capacity_factor')}: token dropping and padding "
                   "(routing is taken as balanced)")
    return tuple(out)


def _first_line(e: BaseException) -> str:
    text = str(e)
    return text.splitlines()[0][:300] if text else ""


# ---- the advice thresholds ---------------------------------------------------------------------
def little_gain(cp: ConfigPrediction) -> str | None:
    """The text of a predicted overlap speedup below ``MIN_GAIN``, else None."""
    p = cp.prediction
    if p.speedup >= MIN_GAIN:
        return None
    return (f"{p.dispatcher} overlap predicted {p.speedup:.2f}x ({secs(p.off_step_s)} off, {secs(p.on_step_s)} on, "
            f"{cp.cluster.num_gpus}x {cp.cluster.gpu}): at best {100 * (p.speedup - 1):+.1f}%")


def clearly_faster(cp: ConfigPrediction, among: Iterable[str]) -> str | None:
    """The text of the best dispatcher in ``among`` when it is predicted more than ``CLEAR_MARGIN``
    faster than the config's dispatcher with overlap on, else None."""
    p = cp.prediction
    best = [(d, x) for d, x in cp.predicted(among) if d != p.dispatcher][:1]
    if not best or p.on_step_s <= step_s(best[0][1]) * (1 + CLEAR_MARGIN):
        return None
    d, x = best[0]
    return (f"{d} predicted {secs(step_s(x))} per step vs {secs(p.on_step_s)} for {p.dispatcher} with overlap on "
            f"({p.on_step_s / step_s(x):.2f}x faster, {cp.cluster.num_gpus}x {cp.cluster.gpu})")
