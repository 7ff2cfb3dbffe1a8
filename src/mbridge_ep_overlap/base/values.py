"""Plain values for JSON, tables and environment variables: the one place that converts them.

Contract: ``jsonable`` turns any config value into something ``json.dumps`` accepts (containers
recursively, other objects as their ``repr``); ``short`` renders a value for a one-line table cell;
``env_value`` renders a ``cfg.env_vars`` value the way a shell export needs it (booleans as 1/0);
``get_path`` / ``set_path`` read and write a dotted config path (``env_vars.NAME`` indexes the dict).
Nothing here imports torch or Megatron.
"""

from __future__ import annotations

from typing import Any

_PLAIN = (bool, int, float, str)


def jsonable(value: Any) -> Any:
    if value is None or isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    name = getattr(value, "__name__", None)
    return name if callable(value) and name else str(value)  # layer-spec functions by name; dtypes, enums


def short(value: Any, width: int = 40) -> str:
    if value is None or isinstance(value, (*_PLAIN, list, tuple, dict)):
        text = value if isinstance(value, str) else repr(value)
    else:
        text = type(value).__name__ + "(...)"
    return text if len(text) <= width else text[: width - 3] + "..."


def env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int) and abs(value).bit_length() > 64:  # no variable takes it; str() may refuse
        return f"<a {abs(value).bit_length()}-bit integer>"
    return str(value)


def get_path(obj: Any, path: str, default: Any = None) -> Any:
    """``get_path(cfg, "model.recompute_method")``; ``env_vars.NAME`` indexes the dict."""
    for part in path.split("."):
        if obj is None:
            return default
        if isinstance(obj, dict):
            obj = obj.get(part, default)
        else:
            obj = getattr(obj, part, default)
    return obj


def set_path(obj: Any, path: str, value: Any) -> None:
    head, _, last = path.rpartition(".")
    parent = get_path(obj, head) if head else obj
    if isinstance(parent, dict):
        parent[last] = value
    else:
        setattr(parent, last, value)
