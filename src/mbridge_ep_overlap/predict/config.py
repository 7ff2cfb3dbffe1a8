"""The prediction for one Megatron-Bridge config on a described target: what ``plan``, the advice
rules and ``dispatcher="auto"`` read.

Contract
--------
* ``cluster_for(target)`` - the ``Cluster`` of a ``ClusterEnvironment`` (GPU kind through
  ``target.gpus.match``, world size, GPUs per node, NVLink domain) and what about it is assumed
  (the scale-out link, when the job leaves one NVLink domain); ``CannotPredict`` when the GPU or
  the world size is unknown or the GPU kind has no hardware model (``hardware.json``).
* ``for_config(cfg, target, *, precision=None, dispatcher=None, assume=None)`` ->
  ``ConfigPrediction``: the config's inputs (``inputs.from_config``), the prediction for its
  dispatcher (or ``dispatcher``) and every dispatcher ranked (``model.rank_dispatchers``), with
  ``lines()`` for ``plan`` and ``to_dict()`` for its JSON (every number in it finite); every
  failure to predict (unknown GPU, a config the model does not cover - malformed or out-of-range
  values, sizes no run can have, arithmetic out of range -, a dispatcher without a bandwidth model)
  is ``CannotPredict`` with the reason, never another exception.
* The advice thresholds: overlap is worth keeping when its predicted speedup is at least
  ``MIN_GAIN``; another dispatcher is *clearly* faster when its predicted step is shorter by more
  than ``CLEAR_MARGIN`` (the model's stated accuracy on step time, ``validation.TARGET``).
  ``little_gain`` / ``clearly_faster`` apply them and return the text the rules quote.

Stdlib only (``core.sizes`` and ``target.gpus`` are plain data and arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..target.gpus import match
from .costs import domain_size, hardware
from .inputs import Cluster, StepInputs, from_config
from .model import NotModelled, OutsideModel, Prediction, rank_dispatchers
from .validation import TARGET

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
            "dispatchers": [{"dispatcher": d, "off_step_s": x.off_step_s, "on_step_s": x.on_step_s,
                             "speedup": x.speedup} if isinstance(x, Prediction)
                            else {"dispatcher": d, "not_modelled": x.reason} for d, x in self.ranking],
        }

    def lines(self) -> list[str]:
        p = self.prediction
        on = secs(p.on_step_s) + ("" if p.supported else " (overlap not supported here)")
        out = [f"  dispatcher          : {p.dispatcher}, {self.cluster.num_gpus}x {self.cluster.gpu}",
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
               assume: Mapping[str, Any] | None = None) -> ConfigPrediction:
    """The prediction for ``cfg`` on ``target`` (module docstring); ``CannotPredict`` otherwise."""
    cluster, assumed = cluster_for(target)
    try:
        inputs = from_config(cfg, cluster.num_gpus, precision=precision, dispatcher=dispatcher, assume=assume)
        ranking = tuple(rank_dispatchers(inputs, cluster))
    except OutsideModel as e:
        raise CannotPredict(f"the config is outside the model ({e.reason})") from None
    except _CONFIG_ERRORS as e:
        raise CannotPredict(f"the config is outside the model ({type(e).__name__}: {_first_line(e)})") from None
    own = dict(ranking)[inputs.dispatcher]
    if isinstance(own, NotModelled):
        raise CannotPredict(own.reason)
    return ConfigPrediction(inputs, cluster, own, ranking, assumed)


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
