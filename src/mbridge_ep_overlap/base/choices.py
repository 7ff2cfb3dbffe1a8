"""The names of every run choice, in one place: dispatcher, flex backend, delayed wgrad,
all-to-all stream priority, resolve mode - and where each choice's value is settled.

Contract
--------
Every module that names a choice imports it from here (the command-line parsers, ``RunSpec``,
``enable``'s ``Options``, the dispatcher decision, the rules, doctor, the step-time model, the
benchmark and tune). ``dispatcher_name`` is the one check of a user-given dispatcher: the
canonical spelling (names are case-insensitive: ``DeepEP`` is ``deepep``) or ``UsageError``
listing the names. ``settle_choices`` is the one place the value of each overlap choice
(``CHOICES``: dispatcher, delayed wgrad, all-to-all priority) is settled, in the order flag given >
recipe registry > the config's own value > library default (``CHOICE_DEFAULTS``), each with its
source (``SETTLED_BY``); a build calls it once and the plan records the sources. Imports nothing of
this package but ``base.errors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

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
DISPATCHER = "dispatcher"
CHOICES = (DISPATCHER, DELAY_WGRAD, HIGH_PRIORITY_A2A)
"""The overlap choices ``settle_choices`` settles."""
CHOICE_DEFAULTS = {DISPATCHER: ALLTOALL, DELAY_WGRAD: False, HIGH_PRIORITY_A2A: True}
"""The library's default of each choice where nobody made one: alltoall (every GPU runs it), delayed wgrad
off (a separate opt-in), the high-priority all-to-all stream (never slower in the paired 2x H200
measurements, docs/benchmarks.md)."""
FLAG, REGISTRY, CONFIG, DEFAULT = "flag", "recipe registry", "config", "default"
SETTLED_BY = (FLAG, REGISTRY, CONFIG, DEFAULT)
"""Where a choice's value came from, first wins: a flag (or argument) given, the registered recipe's
registry row, the value the config already holds, the library default."""


@dataclass(frozen=True)
class Settled:
    """One choice's value and where it came from (one of ``SETTLED_BY``)."""

    value: Any
    source: str


def settle_choices(flags: Mapping[str, Any], registry: Mapping[str, Any] | None = None,
                   config: Mapping[str, Any] | None = None) -> dict[str, Settled]:
    """Each of ``CHOICES`` settled: the first of ``flags`` (what the caller gave), ``registry`` (the
    registered recipe's row), ``config`` (the config's own value, where it is one the choice keeps)
    that is not None, else ``CHOICE_DEFAULTS``. Values are taken as they are (checked where they were
    given)."""
    out = {}
    for name in CHOICES:
        for source, values in ((FLAG, flags), (REGISTRY, registry), (CONFIG, config)):
            value = (values or {}).get(name)
            if value is not None:
                out[name] = Settled(value, source)
                break
        else:
            out[name] = Settled(CHOICE_DEFAULTS[name], DEFAULT)
    return out


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
