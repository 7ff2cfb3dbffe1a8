"""mbridge_ep_overlap: MoE expert-parallel communication overlap for Megatron-Bridge, one call.

Public API (everything else is internal)::

    enable_ep_overlap(cfg, dispatcher=None, *, delay_wgrad=None, high_priority_a2a=None,
                      resolve="error", ...) -> OverlapPlan
    @ep_overlap(dispatcher=None, ...)      (a recipe function's config with enable_ep_overlap applied)
    check_ep_overlap(cfg, *, environment=None) -> list[Violation]
    disable_ep_overlap(cfg) -> list[FieldChange]
    describe(gpu, num_gpus, ...) / probe() -> ClusterEnvironment
    forward_step                            (MB's GPT step, packed sequences passed under overlap)
    RunSpec, build(spec) -> Built          (the one pipeline the tools use)
    diagnose(paths) -> Diagnosis           (the cause of a failed or slow run, from what it left behind)
    EPOverlapError, UsageError, UpstreamRefusal, Violation, Severity, OverlapPlan, FieldChange, RULES

Importing the package has no side effect and loads neither torch nor Megatron: each name is
imported from its module on first use (PEP 562). The modules that need Megatron-Bridge install
the import shims themselves (``target.shims``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.2.0"

_EXPORTS = {
    "enable_ep_overlap": "core.enable",
    "disable_ep_overlap": "core.enable",
    "ep_overlap": "core.decorate",
    "check_ep_overlap": "core.engine",
    "EPOverlapError": "base.errors",
    "UsageError": "base.errors",
    "UpstreamRefusal": "base.errors",
    "Violation": "base.errors",
    "Severity": "base.errors",
    "OverlapPlan": "core.plan",
    "FieldChange": "core.plan",
    "RULES": "core.rules",
    "ClusterEnvironment": "target.cluster",
    "describe": "target.cluster",
    "probe": "target.probe",
    "forward_step": "core.forward_step",
    "RunSpec": "spec",
    "build": "pipeline",
    "diagnose": "diagnose",
    "Diagnosis": "diagnose",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _EXPORTS[name] in ("core.enable", "core.decorate", "core.engine", "core.forward_step", "pipeline"):
        from .target import shims

        shims.install()  # these import Megatron-Bridge: MB 0.6.2 needs TE / NVRx placeholders without them
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .pipeline import build
    from .core.decorate import ep_overlap
    from .core.enable import disable_ep_overlap, enable_ep_overlap
    from .core.engine import check_ep_overlap
    from .base.errors import EPOverlapError, Severity, UpstreamRefusal, UsageError, Violation
    from .core.forward_step import forward_step
    from .core.plan import FieldChange, OverlapPlan
    from .diagnose import Diagnosis, diagnose
    from .core.rules import RULES
    from .spec import RunSpec
    from .target.cluster import ClusterEnvironment, describe
    from .target.probe import probe
