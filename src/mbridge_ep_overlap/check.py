"""The rule engine: iterate ``rules.RULES`` over a config and collect every violation.

Contract: ``evaluate`` never mutates the config and never stops at the first problem; it returns
all violations (errors, warnings, advice) and the ids of rules it could not check because a fact
was unknown (say, no GPU described on a CPU login node). ``check_ep_overlap`` is the public form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from . import environment as environment_mod
from .environment import ClusterEnvironment
from .errors import EPOverlapError, Severity, Violation
from .facts import Facts
from .rules import RULES, Rule


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    not_applicable: list[str] = field(default_factory=list)
    facts: Facts | None = None

    def status_rows(self) -> list[tuple[str, str, str]]:
        """(rule id, status, detail) for every rule, in table order."""
        failed = {v.rule_id: v for v in self.violations}
        rows = []
        for rule in RULES:
            if rule.id in failed:
                v = failed[rule.id]
                rows.append((rule.id, v.severity.value.upper(), f"{v.field} = {v.current!r}; required {v.required}"))
            elif rule.id in self.not_checked:
                rows.append((rule.id, "not checked", "a fact it needs is unknown here"))
            elif rule.id in self.passed:
                rows.append((rule.id, "pass", rule.required))
            else:
                rows.append((rule.id, "n/a", f"applies when {rule.when}"))
        return rows

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity is Severity.ERROR]

    def raise_for_errors(self, context: str = "") -> None:
        if self.errors:
            raise EPOverlapError(self.violations, context)


def violation_of(rule: Rule, facts: Facts) -> Violation:
    return Violation(
        rule_id=rule.id,
        severity=rule.severity,
        field=rule.field,
        current=rule.value(facts),
        required=rule.required,
        message=rule.message,
        fix=rule.fix,
        upstream=rule.upstream,
    )


def evaluate(
    cfg: Any,
    environment: ClusterEnvironment | None = None,
    forward_step_func: Callable | None = None,
) -> Report:
    facts = Facts(cfg, environment or environment_mod.current(), forward_step_func)
    report = Report(facts=facts)
    for rule in RULES:
        if not rule.applies(facts):
            report.not_applicable.append(rule.id)
        elif not rule.needs(facts):
            report.not_checked.append(rule.id)
        elif rule.ok(facts):
            report.passed.append(rule.id)
        else:
            report.violations.append(violation_of(rule, facts))
    return report


def check_ep_overlap(
    cfg: Any,
    *,
    environment: ClusterEnvironment | None = None,
    forward_step_func: Callable | None = None,
) -> list[Violation]:
    """All EP-overlap violations of ``cfg`` on ``environment`` (default: this machine)."""
    return evaluate(cfg, environment, forward_step_func).violations
