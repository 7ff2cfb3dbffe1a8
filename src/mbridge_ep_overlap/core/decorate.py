"""``@ep_overlap(...)``: a recipe function whose config comes back with EP overlap on and checked.

Contract: ``ep_overlap(dispatcher=None, **options)`` takes exactly ``enable_ep_overlap``'s arguments
after ``cfg`` and checks them when the decorator is made - a misspelt keyword or a bad value is one
``UsageError`` there, before any recipe is built. The decorated function calls the recipe, applies
``enable_ep_overlap(cfg, ...)`` to the config it returns and returns that config (the plan is the
one ``enable_ep_overlap`` would return: ``check_ep_overlap(cfg)`` reads the rules again). A refused
config raises ``EPOverlapError`` (every violation listed), a recipe returning something other than
a ``ConfigContainer`` raises ``UsageError``; nothing is caught or retried. ``functools.wraps`` keeps
the recipe's name and docstring, and the undecorated recipe is ``.__wrapped__``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

from .enable import Options, enable_ep_overlap, require_target
from ..base.errors import UsageError

_OPTIONS = tuple(inspect.signature(enable_ep_overlap).parameters)[1:]  # everything after cfg


def ep_overlap(dispatcher: str | None = None, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a recipe function: its config with ``enable_ep_overlap(cfg, dispatcher, **options)``."""
    if callable(dispatcher):  # @ep_overlap without parentheses: the recipe arrived as the dispatcher
        raise UsageError("@ep_overlap", getattr(dispatcher, "__name__", dispatcher),
                         "called with its arguments, e.g. @ep_overlap() or @ep_overlap(dispatcher='alltoall')",
                         "used without parentheses on")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise UsageError("ep_overlap argument", unknown[0], _OPTIONS[1:])
    fields = {f.name for f in dataclasses.fields(Options)}
    Options(dispatcher=dispatcher, **{k: v for k, v in options.items() if k in fields}).validated()
    require_target(options.get("environment"))

    def decorate(recipe: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(recipe):
            raise UsageError("@ep_overlap target", recipe, "a recipe function returning a ConfigContainer", "invalid")

        @functools.wraps(recipe)
        def with_ep_overlap(*args: Any, **kwargs: Any) -> Any:
            cfg = recipe(*args, **kwargs)
            enable_ep_overlap(cfg, dispatcher, **options)
            return cfg

        return with_ep_overlap

    return decorate
