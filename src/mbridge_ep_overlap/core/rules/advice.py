"""Advice (family "environment and advice"): measured reasons to reconsider a configuration that
is valid but unlikely to gain. Never refused; printed with the plan."""

from __future__ import annotations

from .. import dispatcher
from ..errors import Severity
from ..facts import Facts
from .base import Family, When, rule

family = rule.family(Family.ENVIRONMENT)


@family("small-ep-alltoall", When.OVERLAP, "model.expert_model_parallel_size", severity=Severity.ADVICE,
        required="EP > 4, or more than 2 nodes, or a flex dispatcher")
def small_ep_alltoall(f: Facts) -> bool:
    """with EP <= 4 over alltoall on <= 2 nodes the all-to-all is cheap; on 2x H200 NVLink overlap
    measured 0.88-1.02x of overlap off (raw MCore probe and docs/benchmarks.md), at best +2%.

    Fix: benchmark before keeping it (mbridge-ep-overlap bench); MB docs advise against overlap
    here.
    """
    return (f.dispatcher != "alltoall" or (f.model("expert_model_parallel_size") or 1) > 4
        or (f.env.num_nodes or 1) > 2)


@family("small-ep-deepep", When.OVERLAP_FLEX, "model.expert_model_parallel_size", severity=Severity.ADVICE,
        required=f"EP >= {dispatcher.DEEPEP_MIN_EP} for 'deepep' (where "
                "DeepEP pays), else dispatcher='alltoall'")
def small_ep_deepep(f: Facts) -> bool:
    """at small EP DeepEP measured slower than alltoall; on 2x H200 (EP 2, NVLink) overlap with
    DeepEP ran at 0.75-0.90x of overlap off, 9-45% of its dispatch/combine hidden.

    Fix: use dispatcher='alltoall' (or 'auto') below EP 16, or benchmark it (mbridge-ep-overlap
    bench --variants off,deepep).
    """
    return f.flex_backend != "deepep" or (f.model("expert_model_parallel_size") or 1) >= dispatcher.DEEPEP_MIN_EP


RULES = family.rules
