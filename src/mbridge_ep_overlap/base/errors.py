"""Typed results and errors: what a refusal looks like to a user.

Contract: every user-facing refusal in this library is an ``EPOverlapError`` (a ``ValueError``)
carrying *all* ``Violation`` objects found, never only the first; each violation names the rule,
the config field, the value found, the value required and a one-line fix. Bad command-line or
API arguments (unknown dispatcher, GPU, recipe, a value of the wrong type) are ``UsageError``
(also a ``ValueError``), whose one-line message names the argument, the value given and what is
allowed. A check that Megatron-Bridge / Megatron-Core make and no rule of ours covers surfaces as
``UpstreamRefusal`` naming upstream's exception. Nothing here imports torch or Megatron.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any

from .sizes import shown
from .values import jsonable


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
    more: str = ""
    """Where the rule's whole text can be read (empty for a check that is not a rule of the table)."""

    def line(self) -> str:
        return (
            f"[{self.severity.value}] {self.rule_id}: {self.message} "
            f"(field {self.field} = {self.current!r}; required: {self.required}). Fix: {self.fix}"
            + (f". More: {self.more}" if self.more else "")
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["severity"] = self.severity.value
        d["current"] = jsonable(self.current)
        return d


class EPOverlapError(ValueError):
    """The configuration cannot run EP overlap as asked. ``violations`` lists every reason."""

    def __init__(self, violations: list[Violation], context: str = "", overlap: bool = True):
        self.violations = list(violations)
        errors = [v for v in self.violations if v.severity is Severity.ERROR]
        what = "EP overlap refused" if overlap else "config refused (EP overlap off)"
        head = f"{what}{f' ({context})' if context else ''}: {len(errors)} violation(s)"
        body = "\n".join(f"  - {v.line()}" for v in errors or self.violations)
        super().__init__(f"{head}\n{body}")


class UpstreamRefusal(ValueError):
    """Megatron-Bridge / Megatron-Core refused a config for a reason none of our rules covers."""

    def __init__(self, error: BaseException, where: str = "Megatron-Bridge finalize") -> None:
        self.error = error
        first = str(error).strip().splitlines()[0] if str(error).strip() else "(no message)"
        super().__init__(
            f"{where} refused the config: {type(error).__name__}: {first} "
            "(no rule of mbridge_ep_overlap covers this check yet)"
        )


class UsageError(ValueError):
    """A bad argument to the API or CLI: names the value given and the values allowed."""

    def __init__(self, what: str, value: Any, allowed, problem: str = "unknown") -> None:
        allowed_text = ", ".join(str(a) for a in allowed) if not isinstance(allowed, str) else allowed
        if problem == "missing" and value is None:  # a flag or argument that was not given at all
            super().__init__(f"missing {what}: {allowed_text}")
        else:  # an int beyond 64 bits by its size: 10**5000 cannot even be printed
            given = shown(value) if isinstance(value, int) and abs(value).bit_length() > 64 else repr(value)
            super().__init__(f"{problem} {what} {given}; allowed: {allowed_text}")
        self.what, self.value, self.allowed, self.problem = what, value, allowed, problem


def require_optional_bool(name: str, value: Any) -> None:
    """True, False or None, else ``UsageError`` - 1 and 0 compare equal to True and False, but are not
    the flag's type (the API's other type checks refuse them the same way)."""
    if value is not None and not isinstance(value, bool):
        raise UsageError(name, value, (True, False, None), "invalid")
