"""A finalized config as YAML that plain Megatron-Bridge loads, without this package.

Contract
--------
``plain_dict(cfg)`` is MB's own ``cfg.to_dict()`` with the top-level ``_target_`` naming the
Megatron-Bridge class the config is an instance of (``megatron.bridge.training.config.ConfigContainer``),
not the enforcing subclass this package swaps in (``core.enforcement``). ``write_yaml(cfg, path)``
writes it the way MB's ``to_yaml`` does (``safe_yaml_representers``, ``yaml.safe_dump``), so
``ConfigContainer.from_yaml(path)`` loads it on a machine where ``mbridge_ep_overlap`` is not installed.
A config holding anything else of this package (a ``_target_`` under ``mbridge_ep_overlap.``, found
anywhere in the tree) is refused with ``NotPortable`` (a ``UsageError``: exit 2, one line) naming the field, before anything is written:
that file would not load without the package, which is the point of writing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..base.errors import UsageError

_OURS = "mbridge_ep_overlap."


class NotPortable(UsageError):
    """A field of the config names a class of this package: plain Megatron-Bridge could not load it."""

    def __init__(self, field: str, target: str) -> None:
        super().__init__(f"config field {field}", target, "a Megatron-Bridge or Megatron-Core class (plain "
                         "Megatron-Bridge could not load the YAML; set that field to the upstream class)",
                         "not portable:")
        self.field, self.target = field, target


def upstream_class(cls: type) -> type:
    """The first class in ``cls``'s MRO defined outside this package (MB's ``ConfigContainer``)."""
    return next(c for c in cls.__mro__ if not c.__module__.startswith(_OURS.rstrip(".")))


def _check(value: Any, where: str) -> None:
    if isinstance(value, dict):
        target = value.get("_target_")
        if isinstance(target, str) and target.startswith(_OURS):
            raise NotPortable(where or "(top level)", target)
        for key, item in value.items():
            _check(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for n, item in enumerate(value):
            _check(item, f"{where}[{n}]")


def plain_dict(cfg: Any) -> dict[str, Any]:
    data = cfg.to_dict()
    base = upstream_class(type(cfg))
    data["_target_"] = f"{base.__module__}.{base.__qualname__}"
    _check(data, "")
    return data


def write_yaml(cfg: Any, path: str | Path) -> Path:
    import yaml  # PyYAML and MB's representers come with Megatron, which the caller has imported already
    from megatron.training.config.yaml_utils import safe_yaml_representers

    data = plain_dict(cfg)
    path = Path(path)
    with safe_yaml_representers():
        text = yaml.safe_dump(data, default_flow_style=False)
    path.write_text(text)
    return path
