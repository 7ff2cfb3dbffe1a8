"""Typed results and errors: what a refusal looks like to a user.

Contract: every user-facing refusal in this library is an ``EPOverlapError`` (a ``ValueError``)
carrying *all* ``Violation`` objects found, never only the first; each violation names the rule,
the config field, the value found, the value required and a one-line fix. Bad command-line or
API arguments (unknown dispatcher, GPU, recipe) are ``UsageError`` (also a ``ValueError``).
"""

from __future__ import annotations

import argparse
import enum
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable


class Severity(str, enum.Enum):
    """How a violation is treated.

    ERROR: Megatron would assert, hang, or silently not do what was asked; finalize refuses.
    WARNING: runs, but the user loses most of what overlap is for; printed, never refused.
    ADVICE: a measured or documented reason to reconsider; printed only.
    """

    ERROR = "error"
    WARNING = "warning"
    ADVICE = "advice"


@dataclass(frozen=True)
class Violation:
    rule_id: str
    severity: Severity
    field: str
    current: Any
    required: str
    message: str
    fix: str
    upstream: str = ""

    def line(self) -> str:
        return (
            f"[{self.severity.value}] {self.rule_id}: {self.message} "
            f"(field {self.field} = {self.current!r}; required: {self.required}). Fix: {self.fix}"
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["severity"] = self.severity.value
        d["current"] = _jsonable(self.current)
        return d


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


class EPOverlapError(ValueError):
    """The configuration cannot run EP overlap as asked. ``violations`` lists every reason."""

    def __init__(self, violations: list[Violation], context: str = ""):
        self.violations = list(violations)
        errors = [v for v in self.violations if v.severity is Severity.ERROR]
        head = f"EP overlap refused{f' ({context})' if context else ''}: {len(errors)} violation(s)"
        body = "\n".join(f"  - {v.line()}" for v in errors or self.violations)
        super().__init__(f"{head}\n{body}")


class UpstreamRefusal(ValueError):
    """Megatron-Bridge / Megatron-Core refused a config for a reason none of our rules covers."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        super().__init__(
            f"Megatron-Bridge finalize refused the config: {type(error).__name__}: {error} "
            "(no rule of mbridge_ep_overlap covers this check yet)"
        )


class UsageError(ValueError):
    """A bad argument to the API or CLI: names the value given and the values allowed."""

    def __init__(self, what: str, value: Any, allowed) -> None:
        allowed_text = ", ".join(str(a) for a in allowed) if not isinstance(allowed, str) else allowed
        super().__init__(f"unknown {what} {value!r}; allowed: {allowed_text}")
        self.what, self.value, self.allowed = what, value, allowed


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad usage as one line on stderr and exits 2 (no usage dump)."""

    def error(self, message: str) -> None:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def run_reporting_errors(prog: str, action: Callable[[], int]) -> int:
    """Exit codes shared by our commands: ``action()``'s own; 1 for a refused config (every
    violation printed); 2 for bad usage (one line). Never a traceback for either."""
    try:
        return action()
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except (EPOverlapError, UpstreamRefusal) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
