"""The rule engine: evaluate ``rules.RULES`` over a config, collecting every violation.

Contract: ``evaluate`` never mutates the config and never stops at the first problem; it returns
a ``Report`` with all violations (errors, warnings, advice), the rules it could not check because
a fact was unknown on the target (say, no GPU described on a CPU login node) or a value they read
is malformed (the value rules, evaluated first, name it), those that passed and those that did
not apply. It never raises for a config, however malformed. It is the only place the table is iterated; ``evaluations`` counts
the calls (the tools promise one evaluation per build). ``check_ep_overlap`` is the public form.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from ..target.cluster import ClusterEnvironment
from .arguments import require_config, require_target
from ..base.errors import EPOverlapError, Severity, Violation
from .facts import Facts
from .rules import RULES

_counter = itertools.count(1)
evaluations = 0  # how many times the table was evaluated in this process (tests and the note read it)


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    not_applicable: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)  # rule id -> why its check could not read the config
    overlap: bool = True  # whether the judged config had EP overlap on (names the refusal)

    def status_rows(self) -> list[tuple[str, str, str]]:
        """(rule id, status, detail) for every rule, in table order."""
        failed = {v.rule_id: v for v in self.violations}
        rows = []
        for rule in RULES:
            if rule.id in failed:
                v = failed[rule.id]
                rows.append((rule.id, v.severity.value.upper(), f"{v.field} = {v.current!r}; required {v.required}"))
            elif rule.id in self.unreadable:
                rows.append((rule.id, "not checked", f"a value it reads is malformed ({self.unreadable[rule.id]})"))
            elif rule.id in self.not_checked:
                rows.append((rule.id, "not checked", "a fact it needs is unknown here"))
            elif rule.id in self.passed:
                rows.append((rule.id, "pass", rule.required))
            else:
                rows.append((rule.id, "n/a", f"applies when {rule.when.value}"))
        return rows

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity is Severity.ERROR]

    def raise_for_errors(self, context: str = "") -> None:
        if self.errors:
            raise EPOverlapError(self.violations, context, overlap=self.overlap)


def evaluate(cfg: Any, environment: ClusterEnvironment | None = None, forward_step_func: Callable | None = None) -> Report:
    """Every rule against ``cfg`` on ``environment`` (default: the current target, see ``target.simulate``)."""
    global evaluations
    if environment is None:
        from ..target.simulate import current

        environment = current()
    evaluations = next(_counter)
    facts = Facts(cfg, environment, forward_step_func)
    report = Report()
    try:
        report.overlap = bool(facts.overlap)
    except UNREADABLE:
        pass
    for rule in sorted(RULES, key=lambda r: not r.sanity):  # value checks first (stable order otherwise)
        try:
            if not rule.applies(facts):
                report.not_applicable.append(rule.id)
            elif not rule.checkable(facts):
                report.not_checked.append(rule.id)
            elif rule.ok(facts):
                report.passed.append(rule.id)
            else:
                report.violations.append(rule.violation(facts))
        except UNREADABLE as e:  # a malformed value (a value rule names it): never a traceback
            report.unreadable[rule.id] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            report.not_checked.append(rule.id)
    return report


def malformed(cfg: Any, environment: ClusterEnvironment) -> list[Violation]:
    """The value rules alone (types and ranges; ``Rule.sanity``): what ``enable`` checks before it
    edits anything. Not counted in ``evaluations`` (the full table is still evaluated once)."""
    facts = Facts(cfg, environment)
    out = []
    for rule in RULES:
        if not rule.sanity:
            continue
        try:
            if rule.applies(facts) and rule.checkable(facts) and not rule.ok(facts):
                out.append(rule.violation(facts))
        except UNREADABLE:
            pass
    return out


UNREADABLE = (TypeError, ValueError, ZeroDivisionError, AttributeError, KeyError, IndexError)
"""What reading a malformed value raises (in a check, or in code that had to read it first)."""


def check_ep_overlap(
    cfg: Any,
    *,
    environment: ClusterEnvironment | None = None,
    forward_step_func: Callable | None = None,
) -> list[Violation]:
    """All EP-overlap violations of ``cfg`` on ``environment`` (default: this machine)."""
    require_config(cfg)
    require_target(environment)
    return evaluate(cfg, environment, forward_step_func).violations
