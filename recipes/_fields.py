"""Recipe helper: set several fields of one config section, refusing names it does not have
(a typo in a recipe must fail loudly, not add an attribute MB never reads)."""

from __future__ import annotations

from typing import Any


def set_fields(obj: Any, **values: Any) -> None:
    for name, value in values.items():
        if not hasattr(obj, name):
            raise AttributeError(f"{type(obj).__name__} has no field {name!r}")
        setattr(obj, name, value)
