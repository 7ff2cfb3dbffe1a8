"""Advice (family "environment and advice"): reasons to reconsider a configuration that is valid
but predicted to gain little. Never refused; printed with the plan.

Both rules read the step-time prediction (``Facts.prediction``, ``core.prediction``; method and
validation in docs/prediction.md): they advise when EP overlap with the config's dispatcher is
predicted below ``MIN_GAIN`` (1.03x) on this target, or when another dispatcher that can run there
is predicted more than ``CLEAR_MARGIN`` (10%, the model's stated accuracy) faster. Where no
prediction can be made (GPU or world size unknown, a GPU kind without a hardware model, a config
the model does not cover - a value a values rule refuses, a size beyond 2**63 - 1, a step whose
arithmetic would not be finite) they are "not checked": ``for_config`` raises only ``CannotPredict``
and every prediction it makes is finite, so these rules never fire on, or crash over, a number the
model could not compute.
"""

from __future__ import annotations

from typing import Callable

from ..prediction import CLEAR_MARGIN, MIN_GAIN, clearly_faster, little_gain
from .. import dispatcher
from ...base.choices import MEASURED_DISPATCHERS
from ...base.errors import Severity
from ..facts import Facts
from .base import Family, When, rule

family = rule.family(Family.ENVIRONMENT)

_MODELLED = MEASURED_DISPATCHERS
_REQUIRED = (f"overlap predicted >= {MIN_GAIN}x on the target and no dispatcher that can run there predicted "
             f"> {CLEAR_MARGIN:.0%} faster")


def _verdict(f: Facts) -> str | None:
    """The advice text with the predicted numbers, None when there is nothing to advise."""
    cp = f.prediction
    own = cp.prediction.dispatcher
    usable = [d for d in _MODELLED if d != own and not dispatcher.problems(d, f.env)]
    parts = [little_gain(cp), clearly_faster(cp, usable)]
    faster = cp.predicted(usable)[:1]
    if parts[1] and faster and dispatcher.availability(faster[0][0], f.env) is None:
        parts[1] += f" - {faster[0][0]} is not known to be installed there"
    text = "; ".join(p for p in parts if p)
    return text or None


def _for(name: str) -> Callable[[Facts], bool]:
    return lambda f: f.dispatcher_name != name or f.prediction is not None


@family("predicted-gain-alltoall", When.OVERLAP, "model.moe_token_dispatcher_type", severity=Severity.ADVICE,
        required=_REQUIRED, needs=_for("alltoall"), current=_verdict)
def predicted_gain_alltoall(f: Facts) -> bool:
    """EP overlap with alltoall is not the best choice predicted for this target: the value found
    says why - its own predicted gain is small, or another dispatcher is predicted clearly faster
    there (step-time model, docs/prediction.md; the measurements so far, on 2x H200 only, are in
    docs/benchmarks.md).

    Fix: benchmark before keeping it (mbridge-ep-overlap bench run), or turn overlap off, or use the
    faster dispatcher (dispatcher='auto' ranks the installed ones by the prediction).
    """
    return f.dispatcher_name != "alltoall" or _verdict(f) is None


@family("predicted-gain-deepep", When.OVERLAP_FLEX, "model.moe_flex_dispatcher_backend", severity=Severity.ADVICE,
        required=_REQUIRED, needs=_for("deepep"), current=_verdict)
def predicted_gain_deepep(f: Facts) -> bool:
    """EP overlap with DeepEP is not the best choice predicted for this target: the value found says
    why - its own predicted gain is small, or another dispatcher is predicted clearly faster there
    (step-time model, docs/prediction.md; the measurements so far, on 2x H200 only, are in
    docs/benchmarks.md).

    Fix: use the faster dispatcher (dispatcher='auto' ranks the installed ones by the prediction),
    or benchmark it (mbridge-ep-overlap bench run --variants off,deepep).
    """
    return f.flex_backend != "deepep" or _verdict(f) is None


RULES = family.rules
