"""mbridge_ep_overlap: MoE expert-parallel communication overlap for Megatron-Bridge, one call.

Public API (everything else is internal):

    enable_ep_overlap(cfg, dispatcher="alltoall", *, delay_wgrad=False, resolve="error", ...) -> OverlapPlan
    check_ep_overlap(cfg, *, environment=None) -> list[Violation]
    EPOverlapError, Violation, Severity, OverlapPlan, ClusterEnvironment, describe, probe
"""

from . import import_shims as _import_shims

_import_shims.install()  # only for missing TE / NVRx, only for MB's two import sites; see its contract

from .check import check_ep_overlap  # noqa: E402
from .enable import enable_ep_overlap  # noqa: E402
from .environment import ClusterEnvironment, describe, probe  # noqa: E402
from .errors import EPOverlapError, Severity, UpstreamRefusal, UsageError, Violation  # noqa: E402
from .plan import FieldChange, OverlapPlan  # noqa: E402
from .rules import RULES  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "enable_ep_overlap",
    "check_ep_overlap",
    "EPOverlapError",
    "UsageError",
    "UpstreamRefusal",
    "Violation",
    "Severity",
    "OverlapPlan",
    "FieldChange",
    "ClusterEnvironment",
    "describe",
    "probe",
    "RULES",
]
