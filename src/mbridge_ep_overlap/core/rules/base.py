"""What a rule is: one object holding the constraint's text and its check side by side.

Contract
--------
A ``Rule`` is one constraint Megatron-Core 0.19 / Megatron-Bridge 0.6.2 put on EP overlap (or a
silent failure nobody upstream checks): its id, family, when it applies (``When``), the config
field, what is required, the message, the fix, the predicate ``check`` over ``Facts``, and
optionally

* ``needs``: False when a fact the check needs is unknown on this target -> "not checked";
* ``current``: the value shown to the user (default: the field's value);
* ``auto_fix``: the documented edits ``resolve="auto"`` applies (none => only the user can fix it);
* ``upstream`` and ``upstream_match``: which upstream check it mirrors and a regex fragment of
  upstream's own message, which the parity tests match so a rule cannot drift from upstream;
* ``sanity``: a check of a value's type or range, evaluated before the others.

Adding a rule is adding one object to its family module and one parity case. This module also
holds the small predicates several families share.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

from packaging.version import InvalidVersion, Version

from ...base.errors import Severity, Violation
from ..facts import Facts, get_path

Fix = Callable[[Facts], list[tuple[str, Any]]]


class When(enum.Enum):
    OVERLAP = "overlap on"
    DELAY_WGRAD = "delayed wgrad on"
    OVERLAP_FLEX = "overlap on with the flex dispatcher"
    FLEX = "the flex dispatcher (overlap on or off)"
    ALWAYS = "always"

    def applies(self, facts: Facts) -> bool:
        if self is When.ALWAYS:
            return True
        if self is When.DELAY_WGRAD:
            return facts.delay_wgrad
        if self is When.OVERLAP_FLEX:
            return facts.overlap and facts.dispatcher == "flex"
        if self is When.FLEX:
            return facts.dispatcher == "flex"
        return facts.overlap


class Family(enum.Enum):
    OVERLAP = "overlap core"
    DELAY_WGRAD = "delayed wgrad"
    FLEX = "flex dispatchers"
    TOPOLOGY = "topology and batch"
    ENVIRONMENT = "environment and advice"
    VALUES = "config values (types and ranges)"


class Upstream(enum.Enum):
    """The upstream check a rule mirrors; NONE: a silent failure this library exists to catch."""

    NONE = ""
    MCORE = "megatron-core 0.19 TransformerConfig.__post_init__"
    MB_SETUP = "megatron-bridge 0.6.2 CommOverlapConfig.setup"
    MB_FLEX = "megatron-bridge 0.6.2 validate_flex_dispatcher_backend"
    MB_FINALIZE = "megatron-bridge 0.6.2 ConfigContainer finalize / validate"

    @property
    def source(self) -> tuple[str, str] | None:
        """Where the check lives in the installed package: (path under site-packages, qualified name)."""
        return _UPSTREAM_SOURCES.get(self.name)


_UPSTREAM_SOURCES: dict[str, tuple[str, str]] = {
    "MCORE": ("megatron/core/transformer/transformer_config.py", "TransformerConfig.__post_init__"),
    "MB_SETUP": ("megatron/bridge/training/comm_overlap.py", "CommOverlapConfig.setup"),
    "MB_FLEX": ("megatron/bridge/training/flex_dispatcher_backend.py", "validate_flex_dispatcher_backend"),
    "MB_FINALIZE": ("megatron/bridge/training/config.py", "ConfigContainer.validate"),
}


def reference(rule_id: str) -> str:
    """Where a user reads the whole text of a rule: the ``rule`` command and the generated page."""
    return f"mbridge-ep-overlap rule {rule_id} or docs/rules.md#{rule_id}"


@dataclass(frozen=True, kw_only=True)
class Rule:
    id: str
    family: Family
    when: When
    field: str
    required: str
    message: str
    fix: str
    check: Callable[[Facts], bool]
    severity: Severity = Severity.ERROR
    needs: Callable[[Facts], bool] | None = None
    current: Callable[[Facts], Any] | None = None
    auto_fix: Fix | None = None
    upstream: Upstream = Upstream.NONE
    upstream_match: str = ""
    sanity: bool = False
    """True for the value checks (types and ranges) the engine evaluates first."""

    def applies(self, facts: Facts) -> bool:
        return self.when.applies(facts)

    def checkable(self, facts: Facts) -> bool:
        return self.needs is None or bool(self.needs(facts))

    def ok(self, facts: Facts) -> bool:
        return bool(self.check(facts))

    def value(self, facts: Facts) -> Any:
        return self.current(facts) if self.current else get_path(facts.cfg, self.field)

    def violation(self, facts: Facts) -> Violation:
        return Violation(rule_id=self.id, severity=self.severity, field=self.field, current=self.value(facts),
                         required=self.required, message=self.message, fix=self.fix, upstream=self.upstream.value,
                         more=reference(self.id))


class rule:  # noqa: N801 - used as a decorator, like pylint's and ruff's rule registrations
    """``family = rule.family(Family.X)``; then ``@family(id, when, field, required=..., ...)`` on the
    check function turns it into a ``Rule``: the docstring's first paragraph is the message, its
    ``Fix:`` paragraph the fix. ``family.rules`` is the family's rules in definition order."""

    def __init__(self, family: Family) -> None:
        self.family_ = family
        self.rules: list[Rule] = []

    @classmethod
    def family(cls, family: Family) -> "rule":
        return cls(family)

    def __call__(self, rule_id: str, when: When, field: str, **options: Any) -> Callable[[Callable], Rule]:
        def register(check: Callable[[Facts], bool]) -> Rule:
            message, fix = _message_and_fix(check)
            made = Rule(id=rule_id, family=self.family_, when=when, field=field, message=message, fix=fix,
                        check=check, **options)
            self.rules.append(made)
            return made

        return register


def _message_and_fix(check: Callable) -> tuple[str, str]:
    import inspect

    doc = inspect.getdoc(check) or ""
    head, _, fix = doc.partition("Fix: ")
    message, fix = " ".join(head.split()).rstrip("."), " ".join(fix.split()).rstrip(".")
    if not message or not fix:
        raise RuntimeError(f"rule {check.__name__}: its docstring needs a message and a 'Fix: ...' paragraph")
    return message, fix


# ---- predicates and fixes shared by several families -------------------------------------------
def set_to(path: str, value: Any) -> Fix:
    def edit(facts: Facts) -> list[tuple[str, Any]]:
        return [(path, value)]

    edit.__doc__ = f"sets {path} = {value!r}"  # the rule reference shows it
    return edit


def version_at_least(version: str | None, minimum: str) -> bool:
    """``version >= minimum`` as PEP 440 orders them: a ``2.7.0.dev0`` or ``rc1`` build is older than ``2.7.0``.
    For a gate that another package applies to a version (MCore's ``is_te_min_version`` compares
    ``packaging`` versions exactly so): the rule must refuse what that package refuses. False for an unknown or
    unparsable version."""
    try:
        return Version(version) >= Version(minimum)
    except (InvalidVersion, TypeError):
        return False


def release_before(version: str | None, release: str) -> bool:
    """True when ``version``'s release number is below ``release``: a ``2.9.0.dev0`` or ``rc`` build counts as 2.9.
    For a behaviour a package's own code has from a release on (Transformer Engine's own capability checks): a
    development build of that release already carries the code. False for an unknown or unparsable version."""
    try:
        return Version(version).release < Version(release).release
    except (InvalidVersion, TypeError):
        return False


def te_at_least(minimum: str) -> Callable[[Facts], bool]:
    return lambda f: bool(f.te_usable) and version_at_least(f.env.te_version, minimum)


def te_known(f: Facts) -> bool:
    return f.te_usable is not None


def without(items: Any, name: str) -> list:
    return [m for m in (items or []) if m != name]
