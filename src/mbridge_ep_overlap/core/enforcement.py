"""Finalize-time enforcement: MB's own finalize path runs our rules first.

Contract
--------
``install(cfg)`` swaps ``cfg``'s class for a subclass of its ``ConfigContainer`` class that adds
exactly two hooks and no fields:

* ``set_data_parallel_size()`` - ``runtime_config_update`` (what ``pretrain()`` calls) runs it
  after mixed precision is applied and *before* ``CommOverlapConfig.setup()`` and MCore's
  ``__post_init__`` reach their first bare assert; our rules run before MB's own arithmetic there;
* ``validate()`` - for callers that validate directly.

Both run every rule against the config as it is *now* (so Hydra-style overrides applied after
``enable_ep_overlap`` are checked) on the current target (``target.simulate.current``: the
simulated target in a dry run, what is really installed on a GPU node), with the forward step
``pretrain()`` was given when they run inside it (``step_given_to_pretrain``), and raise
``EPOverlapError`` listing all errors on every rank; warnings are logged once, by rank 0. Inside
``already_checked(cfg, report)`` - used by ``build`` between its one evaluation and MB's finalize
of the same object - the report is reused instead of evaluating the table again. The subclass
serialises under its own ``_target_`` so a YAML round trip keeps the enforcement; ``remove(cfg)``
restores the class. Importing this module imports Megatron-Bridge (with the import shims).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
from typing import Callable, Iterator

from ..target import shims
from .engine import Report, evaluate
from ..base.errors import EPOverlapError, Severity, Violation

shims.install()  # explicit: MB 0.6.2 imports TE / NVRx unconditionally (see target.shims)

logger = logging.getLogger("mbridge_ep_overlap")
_warned: set[str] = set()
_CHECKED: contextvars.ContextVar[tuple[int, Report] | None] = contextvars.ContextVar(
    "mbridge_ep_overlap_checked", default=None)


@contextlib.contextmanager
def already_checked(cfg, report: Report) -> Iterator[None]:
    """Within this block, enforcement on ``cfg`` (this object) reuses ``report``."""
    token = _CHECKED.set((id(cfg), report))
    try:
        yield
    finally:
        _CHECKED.reset(token)


def _VALIDATE_BEFORE_FINALIZE(mixed_precision: str) -> Violation:  # noqa: N802 - a constant-like factory
    return Violation(
        rule_id="validate-before-runtime-config-update", severity=Severity.ERROR, field="mixed_precision",
        current=mixed_precision, required="a MixedPrecisionConfig (runtime_config_update resolves the recipe name)",
        message="cfg.validate() ran on a config Megatron-Bridge has not finalized: its validate() reads mixed_precision "
        "as an object and fails with an AttributeError",
        fix="call megatron.bridge.training.config.runtime_config_update(cfg) (what pretrain() does): it resolves "
        "mixed_precision, then validates")


def step_given_to_pretrain() -> Callable | None:
    """The ``forward_step_func`` that MB's ``pretrain()`` (``finetune()`` calls it) was given, when
    this finalize runs inside it - read from that frame, identified by MB's own code object - else
    None. It lets the forward-step rules judge the step the run really trains with."""
    import inspect

    from megatron.bridge.training.pretrain import pretrain

    code = inspect.unwrap(pretrain).__code__  # MB wraps it (experimental_fn)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return frame.f_locals.get("forward_step_func")
        frame = frame.f_back
    return None


def enforce(cfg, stage: str) -> None:
    checked = _CHECKED.get()
    if checked and checked[0] == id(cfg):
        report = checked[1]
    else:
        report = evaluate(cfg, forward_step_func=step_given_to_pretrain())
    rank0 = os.environ.get("RANK", "0") == "0"  # errors raise on every rank; warnings print once
    for v in report.violations:
        if rank0 and v.severity is not Severity.ERROR and v.line() not in _warned:
            _warned.add(v.line())
            logger.warning("mbridge_ep_overlap: %s", v.line())
    report.raise_for_errors(stage)


class EPOverlapEnforcement:
    """Mixin placed before the ConfigContainer class in the MRO."""

    def set_data_parallel_size(self) -> None:
        enforce(self, "runtime_config_update")
        super().set_data_parallel_size()

    def validate(self) -> None:
        enforce(self, "validate")
        if isinstance(getattr(self, "mixed_precision", None), str):  # MB's validate() reads it as an object
            raise EPOverlapError([_VALIDATE_BEFORE_FINALIZE(self.mixed_precision)], "validate")
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


def remove(cfg) -> None:
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
