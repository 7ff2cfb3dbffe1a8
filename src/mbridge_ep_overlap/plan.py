"""``OverlapPlan``: what ``enable_ep_overlap`` changed and why, printable as a table or JSON.

Contract: a plan is a record, not an instruction. It lists every field changed (dotted path in the
``ConfigContainer``, old value, new value, reason), the environment variables put into
``cfg.env_vars`` (and those left alone because the user had set them), the dispatcher chosen and
why, warnings and advice that did not block, and rules that could not be checked here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .errors import Violation, _jsonable


@dataclass(frozen=True)
class FieldChange:
    path: str
    old: Any
    new: Any
    reason: str

    def to_dict(self) -> dict:
        return {"path": self.path, "old": _jsonable(self.old), "new": _jsonable(self.new), "reason": self.reason}


@dataclass
class OverlapPlan:
    dispatcher: str
    dispatcher_reason: str
    delay_wgrad: bool
    resolve: str
    environment: str
    changes: list[FieldChange] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)
    env_vars_kept: dict[str, str] = field(default_factory=dict)
    warnings: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)

    def change(self, path: str) -> FieldChange | None:
        for c in reversed(self.changes):
            if c.path == path:
                return c
        return None

    def to_dict(self) -> dict:
        return {
            "dispatcher": self.dispatcher,
            "dispatcher_reason": self.dispatcher_reason,
            "delay_wgrad": self.delay_wgrad,
            "resolve": self.resolve,
            "environment": self.environment,
            "changes": [c.to_dict() for c in self.changes],
            "env_vars": dict(self.env_vars),
            "env_vars_kept": dict(self.env_vars_kept),
            "warnings": [w.to_dict() for w in self.warnings],
            "notes": list(self.notes),
            "not_checked": list(self.not_checked),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def to_table(self) -> str:
        lines = [
            "EP overlap plan",
            f"  environment : {self.environment}",
            f"  dispatcher  : {self.dispatcher} ({self.dispatcher_reason})",
            f"  delay wgrad : {'on' if self.delay_wgrad else 'off'}",
            f"  resolve     : {self.resolve}",
            "",
        ]
        rows = [("field", "old", "new", "reason")] + [
            (c.path, _short(c.old), _short(c.new), c.reason) for c in self.changes
        ]
        lines += _table(rows) if self.changes else ["  (no field changed)"]
        if self.env_vars or self.env_vars_kept:
            lines.append("")
            lines += [f"  env {k}={v}  (set in cfg.env_vars)" for k, v in self.env_vars.items()]
            lines += [f"  env {k}={v}  (kept: already set by you)" for k, v in self.env_vars_kept.items()]
        for w in self.warnings:
            lines.append(f"  {w.severity.value.upper()}: {w.rule_id}: {w.message}. Fix: {w.fix}")
        for n in self.notes:
            lines.append(f"  NOTE: {n}")
        if self.not_checked:
            lines.append(f"  not checked here (facts unknown): {', '.join(self.not_checked)}")
        return "\n".join(lines)

    __str__ = to_table


def _short(value: Any, width: int = 40) -> str:
    text = repr(value) if not isinstance(value, str) else value
    if type(value).__name__ not in ("str", "int", "float", "bool", "NoneType", "list", "tuple", "dict"):
        text = type(value).__name__ + "(...)"
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for n, r in enumerate(rows):
        cells = [str(c).ljust(w) for c, w in zip(r[:-1], widths)]
        out.append("  " + "  ".join(cells) + "  " + str(r[-1]))
        if n == 0:
            out.append("  " + "  ".join("-" * w for w in widths) + "  " + "-" * 6)
    return out
