"""``OverlapPlan``: what ``enable_ep_overlap`` changed and why, printable as a table or JSON.

Contract: a plan is a record, not an instruction. It lists every field changed (dotted path in the
``ConfigContainer``, old value, new value, reason), the environment variables put into
``cfg.env_vars`` (and those left alone because the user had set them), each with the value the
run gets (one an override or the launcher changed after the plan is listed as such), the dispatcher, delayed
wgrad and all-to-all priority *as the config holds them at the end* (and where each was settled:
``settled_by``), warnings and advice that did not
block, rules that could not be checked on the target, and notes. Every change, environment variable
and choice carries exactly one ``provenance.Source`` and its line shows that word first, then why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import Violation
from ..base.values import jsonable, short
from .provenance import Source


@dataclass(frozen=True)
class FieldChange:
    path: str
    old: Any
    new: Any
    reason: str
    """Why, without the provenance word (``source`` carries it)."""
    source: Source

    @property
    def labelled(self) -> str:
        return self.source.labelled(self.reason)

    def to_dict(self) -> dict:
        return {"path": self.path, "old": jsonable(self.old), "new": jsonable(self.new), "reason": self.reason,
                "source": self.source.value}


@dataclass
class OverlapPlan:
    dispatcher: str
    dispatcher_reason: str
    delay_wgrad: bool
    resolve: str
    environment: str
    delay_wgrad_reason: str = ""
    high_priority_a2a: bool = False
    dispatcher_source: Source = Source.DEFAULT
    delay_wgrad_source: Source = Source.DEFAULT
    high_priority_a2a_source: Source = Source.DEFAULT
    settled_by: dict[str, str] = field(default_factory=dict)
    """Where each choice's value was settled (``base.choices.settle_choices``): flag, recipe registry,
    config or default."""
    changes: list[FieldChange] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)
    env_vars_kept: dict[str, str] = field(default_factory=dict)
    env_vars_changed: dict[str, str | None] = field(default_factory=dict)
    """Variables of the plan whose value the run gets is another (an override after it, the launcher's)."""
    warnings: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)

    def env_source(self, name: str) -> Source | None:
        """Where the value of environment variable ``name`` the run gets came from (None: not in the plan)."""
        if name in self.env_vars_changed:
            return Source.OVERRIDE
        if name in self.env_vars_kept:
            return Source.RECIPE
        change = self.change(f"env_vars.{name}")
        return change.source if change is not None and name in self.env_vars else None

    def change(self, path: str) -> FieldChange | None:
        for c in reversed(self.changes):
            if c.path == path:
                return c
        return None

    def to_dict(self) -> dict:
        changes = []
        for c in self.changes:
            row = c.to_dict()
            fields = self._created_fields(c)
            if fields is not None:
                row["new"] = {"type": type(c.new).__name__, **{k: jsonable(v) for k, v in fields.items()}}
            changes.append(row)
        return {
            "dispatcher": self.dispatcher,
            "dispatcher_reason": self.dispatcher_reason,
            "dispatcher_source": self.dispatcher_source.value,
            "delay_wgrad": self.delay_wgrad,
            "delay_wgrad_reason": self.delay_wgrad_reason,
            "delay_wgrad_source": self.delay_wgrad_source.value,
            "high_priority_a2a": self.high_priority_a2a,
            "high_priority_a2a_source": self.high_priority_a2a_source.value,
            "resolve": self.resolve,
            "settled_by": dict(self.settled_by),
            "environment": self.environment,
            "changes": changes,
            "env_vars": dict(self.env_vars),
            "env_vars_kept": dict(self.env_vars_kept),
            "env_vars_changed": dict(self.env_vars_changed),
            "warnings": [w.to_dict() for w in self.warnings],
            "notes": list(self.notes),
            "not_checked": list(self.not_checked),
        }

    def _created_fields(self, change: FieldChange) -> dict[str, Any] | None:
        """For a config object the plan created (``comm_overlap``): the fields the plan then set in it,
        with the values the run gets - the object as recorded at creation still holds None there."""
        if change.new is None or isinstance(change.new, (bool, int, float, str, list, tuple, dict)):
            return None
        later = {c.path[len(change.path) + 1:]: c.new for c in self.changes if c.path.startswith(change.path + ".")}
        return later or None

    def _shown(self, change: FieldChange) -> str:
        fields = self._created_fields(change)
        if fields is None:
            return short(change.new)
        return f"{type(change.new).__name__}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"

    def change_lines(self) -> list[str]:
        """What changed and why (each field ``old -> new`` with its reason, the environment variables),
        then the dispatcher, delayed wgrad, stream priority and notes - the plan as every front end
        prints it."""
        out = ["what changed (field: old -> new, why):"]
        out += [f"  {c.path}: {short(c.old)} -> {self._shown(c)}  ({c.labelled})" for c in self.changes]
        if not self.changes:
            out.append("  (no field changed)")
        out += [f"  env {k}={v}  ({self.env_source(k).labelled('set in cfg.env_vars')})" for k, v in self.env_vars.items()]
        out += [f"  env {k}={v}  ({Source.RECIPE.labelled('kept: in cfg.env_vars before the plan')})"
                for k, v in self.env_vars_kept.items()]
        out += [f"  env {k}={'(unset)' if v is None else v}  ({Source.OVERRIDE.labelled('what the run gets: set after the '
                'plan, by an override or the launcher')})" for k, v in self.env_vars_changed.items()]
        stream = "high priority" if self.high_priority_a2a else "default priority"
        out += [f"  dispatcher  : {self.dispatcher} ({self.dispatcher_source.labelled(self.dispatcher_reason)})",
                f"  delay wgrad : {'on' if self.delay_wgrad else 'off'} "
                f"({self.delay_wgrad_source.labelled(self.delay_wgrad_reason)})",
                f"  a2a stream  : {stream} ({self.high_priority_a2a_source.labelled()})",
                f"  resolve     : {self.resolve}"]
        out += [f"  NOTE: {n}" for n in self.notes]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def to_table(self) -> str:
        """The plan on its own (the API, a training run's log): its changes, then its warnings and the
        rules it could not check. The CLI's report (``tools.plan_report``) shows the same change lines."""
        lines = ["EP overlap plan", f"  environment : {self.environment}", *self.change_lines()]
        for w in self.warnings:
            lines.append(f"  {w.severity.value.upper()}: {w.rule_id}: {w.message} ({w.field} = {short(w.current, 400)}). "
                         f"Fix: {w.fix}")
        if self.not_checked:
            lines.append(f"  not checked here (facts unknown): {', '.join(self.not_checked)}")
        return "\n".join(lines)

    __str__ = to_table

