"""Finalize-time enforcement: MB's own finalize path runs our rules first.

Contract
--------
``install(cfg)`` swaps ``cfg``'s class for a subclass of its ``ConfigContainer`` class that adds
exactly two hooks and no fields:

* ``set_data_parallel_size()`` - ``runtime_config_update`` (what ``pretrain()`` calls) runs it
  after mixed precision is applied and *before* ``CommOverlapConfig.setup()`` and MCore's
  ``__post_init__`` reach their first bare assert;
* ``validate()`` - for callers that validate directly.

Both run every rule against the config as it is *now* (so Hydra-style overrides applied after
``enable_ep_overlap`` are checked) on ``environment.current()`` and raise ``EPOverlapError``
listing all errors on every rank; warnings are logged once, by rank 0. The subclass serialises under its own
``_target_`` so a YAML round trip keeps the enforcement. ``uninstall(cfg)`` restores the class.
"""

from __future__ import annotations

import logging
import os
import sys

from . import environment as environment_mod
from .check import evaluate
from .errors import Severity

logger = logging.getLogger("mbridge_ep_overlap")
_warned: set[str] = set()


def enforce(cfg, stage: str) -> None:
    report = evaluate(cfg, environment_mod.current())
    rank0 = os.environ.get("RANK", "0") == "0"  # errors raise on every rank; warnings print once
    for v in report.violations:
        if rank0 and v.severity is not Severity.ERROR and v.line() not in _warned:
            _warned.add(v.line())
            logger.warning("mbridge_ep_overlap: %s", v.line())
    report.raise_for_errors(stage)


class EPOverlapEnforcement:
    """Mixin placed before the ConfigContainer class in the MRO."""

    def set_data_parallel_size(self) -> None:
        super().set_data_parallel_size()
        enforce(self, "runtime_config_update")

    def validate(self) -> None:
        enforce(self, "validate")
        super().validate()


def _enforcing_class(base: type) -> type:
    from megatron.bridge.training.config import ConfigContainer

    if base is ConfigContainer:
        return EPOverlapConfigContainer
    name = f"EPOverlap{base.__name__}"
    module = sys.modules[__name__]
    cls = getattr(module, name, None)
    if cls is None:
        cls = type(name, (EPOverlapEnforcement, base), {"__module__": __name__, "__qualname__": name})
        setattr(module, name, cls)  # resolvable by _target_ within this process
    return cls


def is_installed(cfg) -> bool:
    return isinstance(cfg, EPOverlapEnforcement)


def install(cfg) -> None:
    if not is_installed(cfg):
        cfg.__class__ = _enforcing_class(type(cfg))


def uninstall(cfg) -> None:
    if is_installed(cfg):
        cfg.__class__ = next(c for c in type(cfg).__mro__[1:] if not issubclass(c, EPOverlapEnforcement))


def _define_container():
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.utils.instantiate_utils import register_allowed_target_prefix

    # MB only instantiates YAML `_target_`s under allowed prefixes; ours must load back.
    register_allowed_target_prefix("mbridge_ep_overlap.")

    class EPOverlapConfigContainer(EPOverlapEnforcement, ConfigContainer):
        """A ``ConfigContainer`` whose finalize runs the EP-overlap rules first."""

    EPOverlapConfigContainer.__module__ = __name__
    EPOverlapConfigContainer.__qualname__ = "EPOverlapConfigContainer"
    return EPOverlapConfigContainer


EPOverlapConfigContainer = _define_container()
