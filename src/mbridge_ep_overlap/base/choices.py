"""The names of every run choice, in one place: dispatcher, flex backend, delayed wgrad,
all-to-all stream priority, resolve mode.

Contract
--------
Every module that names a choice imports it from here (the command-line parsers, ``RunSpec``,
``enable``'s ``Options``, the dispatcher decision, the rules, doctor, the step-time model, the
benchmark and tune). ``dispatcher_name`` is the one check of a user-given dispatcher: the
canonical spelling (names are case-insensitive: ``DeepEP`` is ``deepep``) or ``UsageError``
listing the names. Imports nothing of this package but ``base.errors``.
"""

from __future__ import annotations

from typing import Any

from .errors import UsageError

ALLTOALL = "alltoall"
AUTO = "auto"
"""Not a dispatcher: ask the dispatcher decision to pick one for the target."""
FLEX_BACKENDS = ("deepep", "hybridep", "ncclep")
"""Megatron-Core's flex dispatcher backends (``moe_flex_dispatcher_backend``)."""
DEEP_EP_BACKENDS = ("deepep", "hybridep")
"""The flex backends the ``deep_ep`` package provides."""
NAMED_DISPATCHERS = (ALLTOALL, *FLEX_BACKENDS)
"""The dispatchers a config can hold."""
DISPATCHERS = (*NAMED_DISPATCHERS, AUTO)
"""What a user may ask for."""
MEASURED_DISPATCHERS = (ALLTOALL, *DEEP_EP_BACKENDS)
"""The dispatchers the step-time model, the smoke check, the benchmark and tune cover."""

RESOLVE_MODES = ("error", "auto")
"""``error``: refuse every conflict; ``auto``: apply each documented fix and record it."""

DELAY_WGRAD = "delay_wgrad"
"""Delayed weight-gradient computation (``delay_wgrad_compute``): True / False / None = the recipe's."""
HIGH_PRIORITY_A2A = "high_priority_a2a"
"""The overlapped schedule's all-to-all stream at CUDA high priority (``high_priority_a2a_comm_stream``)."""
ON_OFF = {"on": True, "off": False}
"""How the command lines spell the on/off choices (EP overlap, delayed wgrad)."""
A2A_PRIORITIES = {"default": False, "high": True}
"""How ``--a2a-priority`` spells the all-to-all stream priority (``high_priority_a2a`` True / False)."""
OPTIONAL_SWITCHES = (DELAY_WGRAD, HIGH_PRIORITY_A2A)
"""The on/off choices where None means the recipe's."""


def canonical_dispatcher(dispatcher: Any) -> Any:
    """A dispatcher name in its canonical spelling; anything else as it is, for ``dispatcher_name`` to refuse."""
    return dispatcher.lower() if isinstance(dispatcher, str) else dispatcher


def dispatcher_name(dispatcher: Any) -> str:
    """The canonical name of a user-given dispatcher, or ``UsageError`` listing the names."""
    name = canonical_dispatcher(dispatcher)
    if name not in DISPATCHERS:
        raise UsageError("dispatcher", dispatcher, DISPATCHERS)
    return name


def resolve_mode(resolve: Any) -> str:
    """``resolve`` when it is a resolve mode, else ``UsageError`` listing them."""
    if resolve not in RESOLVE_MODES:
        raise UsageError("resolve mode", resolve, RESOLVE_MODES)
    return resolve
