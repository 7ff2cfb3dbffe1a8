"""An unexpected keyword that Megatron-Core or Megatron-Bridge passes: code written for another version, called by them.

Contract
--------
``PassedKeywords.feed(text, where)`` keeps each ``got an unexpected keyword argument 'K'`` in a line (a ``TypeError:``
prefix, torchrun's ``[rankN]:`` and the function's name before it all optional: a report may quote the words alone), at
most ``MAX_ERRORS``, one per function and keyword, with the ``when instantiating X`` lines under it (a config system's
chain of what it was building). ``findings(errors)`` names each whose keyword the installed megatron-core /
megatron-bridge source passes by name at one or more calls (``passing_calls``: the ``ast.Call`` nodes of
``upstream_source.sources()`` with that keyword) and whose function is not one those packages define
(``defined_there``: the function belongs to the run's own code or to another package, written for an MCore / MB that did
not pass the keyword), or one whose installed definition takes the keyword (the run's copy is older than the code
calling it: mixed releases). One ``passed-keyword:K`` finding from the ``UNEXPECTED_KEYWORD_PASSED_UPSTREAM`` row
(``signatures.install``): the calls that pass it (file:line and the line, at most ``SHOWN_CALLS``: those in a class
the log says was being built first, then those whose callee is a name given to MCore / MB from outside: ``build_module``,
a provider, a spec's submodule), how many there are, and the fix: accept the keyword (or ``**kwargs``) in that function,
or run the MCore / MB release it was written for (for mixed releases: the pair released together). A keyword no
installed call passes, or a function MCore / MB define without the keyword, is not named here (the ``type_errors``
reader and the upstream lookup read those). Nothing is imported; never raises for what is in the lines.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from dataclasses import dataclass, field

from . import class_source, upstream_source
from .report import Finding
from .signatures.install import UNEXPECTED_KEYWORD_PASSED_UPSTREAM

MAX_ERRORS = 8
SHOWN_CALLS = 3
CONTEXT_LINES = 4
"""Lines after the message that may say what was being built (``when instantiating X``)."""
MESSAGE = re.compile(r"(?:(?P<function>[A-Za-z_][\w.]*)\(\) )?(?:got )?(?:an )?unexpected keyword argument '(?P<keyword>\w+)'")
INSTANTIATING = re.compile(r"^\s*when instantiating (?P<name>[A-Za-z_][\w.]*)\s*$")
OUTSIDE_CALLEES = re.compile(r"build_module|provider|submodules?\b|spec|_cls\b|class_|module\b", re.IGNORECASE)
"""A callee that is something handed to MCore / MB from outside (a spec's class, a provider), not their own function."""


@dataclass
class UnexpectedKeyword:
    keyword: str
    function: str
    """As the message names it (``Widget.__init__``), or '' where the report quotes the words alone."""
    where: str
    text: str
    building: list[str] = field(default_factory=list)
    """What a config system was building, innermost first (``when instantiating X``)."""


@dataclass(frozen=True)
class PassingCall:
    rel: str
    line: int
    code: str
    callee: str


class PassedKeywords:
    def __init__(self) -> None:
        self.errors: list[UnexpectedKeyword] = []
        self._last: UnexpectedKeyword | None = None
        self._since = 0

    def feed(self, text: str, where: str) -> None:
        self._since += 1
        if "unexpected keyword" in text and (m := MESSAGE.search(text)) is not None:
            key = (m["function"] or "", m["keyword"])
            seen = next((e for e in self.errors if (e.function, e.keyword) == key), None)
            if seen is None and len(self.errors) < MAX_ERRORS:
                seen = UnexpectedKeyword(m["keyword"], m["function"] or "", where, text.strip()[:300])
                self.errors.append(seen)
            self._last, self._since = seen, 0
        elif self._last is not None and self._since <= CONTEXT_LINES and (m := INSTANTIATING.match(text)):
            if m["name"] not in self._last.building:
                self._last.building.append(m["name"])
            self._since = 0

    def finish(self) -> None:
        self._last = None


@functools.lru_cache(maxsize=64)
def passing_calls(keyword: str) -> tuple[PassingCall, ...]:
    """The calls in the installed megatron-core / megatron-bridge source that pass ``keyword`` by name."""
    out = []
    needle = re.compile(r"\b" + re.escape(keyword) + r"\s*=(?!=)")
    for rel, text in upstream_source.sources():
        if not needle.search(text):
            continue
        if (tree := upstream_source.parsed(rel)) is None:
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and any(k.arg == keyword for k in node.keywords):
                code = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
                out.append(PassingCall(rel, node.lineno, code[:200], _callee(node.func)))
    return tuple(sorted(out, key=lambda c: (not OUTSIDE_CALLEES.search(c.callee), c.rel, c.line)))


@dataclass(frozen=True)
class Definition:
    rel: str
    line: int
    takes: bool
    """Whether its parameters take the keyword (by name, or through ``**kwargs``)."""


@functools.lru_cache(maxsize=64)
def defined_there(name: str, keyword: str) -> Definition | None:
    """The installed megatron-core / megatron-bridge definition of a class of this name (its ``__init__`` through its
    bases; a dataclass's generated one: the fields of its bases too) or of a function, and whether it takes
    ``keyword``; None when they define none."""
    for info in class_source.classes(name):
        chain = class_source.mro(info)
        init = next((m for k in chain if (m := class_source.methods(k).get("__init__")) is not None), None)
        if init is not None:
            return Definition(info.file, info.line, _takes(init.args, keyword))
        if any(_is_dataclass(k.node) for k in chain):
            fields = class_source.class_level(info, keyword)
            return Definition(info.file, info.line, any(kind == "class attribute" for _, _, kind in fields))
    needle = re.compile(r"^\s*(?:async\s+)?def\s+" + re.escape(name) + r"\b", re.MULTILINE)
    for rel, text in upstream_source.sources():
        if needle.search(text) and (tree := upstream_source.parsed(rel)) is not None:
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                    return Definition(rel, node.lineno, _takes(node.args, keyword))
    return None


def _takes(args: ast.arguments, keyword: str) -> bool:
    return keyword in {x.arg for x in (*args.posonlyargs, *args.args, *args.kwonlyargs)} or args.kwarg is not None


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def _building_first(calls: tuple[PassingCall, ...], building: list[str]) -> tuple[PassingCall, ...]:
    """The calls in a class the log says was being built (``when instantiating TransformerLayer``) first."""
    if not building:
        return calls
    texts = dict(upstream_source.sources())
    inside = [c for c in calls if any(re.search(r"^class " + re.escape(b) + r"\b", texts.get(c.rel, ""), re.MULTILINE)
                                      for b in building[1:] or building)]
    return tuple(inside) + tuple(c for c in calls if c not in inside)


def _callee(func: ast.expr) -> str:
    try:
        return ast.unparse(func)[:80]
    except (ValueError, RecursionError):
        return ""


def _owner(function: str) -> str:
    """The class (``Widget`` of ``Widget.__init__``) or function a message names, '' for none."""
    parts = [p for p in function.split(".") if p]
    if not parts:
        return ""
    return parts[-2] if parts[-1] == "__init__" and len(parts) >= 2 else parts[-1]


def findings(errors: list[UnexpectedKeyword]) -> list[Finding]:
    out: dict[str, Finding] = {}
    for e in errors:
        owner = _owner(e.function)
        defined = defined_there(owner, e.keyword) if owner else None
        calls = _building_first(passing_calls(e.keyword), e.building)
        if not calls or (defined is not None and not defined.takes):
            continue  # a function of MCore / MB that does not take it: the type_errors reader's
        sig = _signature(e, owner, calls, defined)
        f = out.setdefault(sig.id, Finding(sig))
        f.add(f"{e.where}: {e.text}")
        if not f.detail:
            f.detail += _detail(e, calls)
    return list(out.values())


def _signature(e: UnexpectedKeyword, owner: str, calls: tuple[PassingCall, ...], defined: Definition | None):
    versions = sorted({upstream_source.installed_version(c.rel) for c in calls})
    who = " / ".join(versions)
    first = f"({len(calls)} call(s), first {calls[0].rel}:{calls[0].line})"
    target = owner or "the function that receives it"
    if defined is not None:
        mine = upstream_source.installed_version(defined.rel)
        cause = (f"The installed {who} passes the keyword {e.keyword!r} by name {first}, and the installed {mine} "
                 f"{owner} takes it ({defined.rel}:{defined.line}); the run's {owner} does not: the run mixes releases, "
                 f"its {mine.split(' ')[0]} older than the code that calls {owner} with {e.keyword!r}.")
        fix = (f"install the megatron-bridge / megatron-core pair released together (the run's {owner} is from a "
               f"release before {e.keyword!r}); or accept {e.keyword!r} (or **kwargs) in {owner}")
    else:
        receiver = f"{owner} (not a function of {who}: the run's own code or another package's)" if owner else \
            "the function that raised it (the log does not name it)"
        cause = (f"The installed {who} passes the keyword {e.keyword!r} by name {first}; {receiver} does not take "
                 f"it: it was written for a release that did not pass {e.keyword!r} yet.")
        fix = (f"accept {e.keyword!r} in {target} (a parameter, or **kwargs passed on), or run the "
               f"{who.split(' ')[0]} release {target} was written for")
    return dataclasses.replace(UNEXPECTED_KEYWORD_PASSED_UPSTREAM, id=f"{UNEXPECTED_KEYWORD_PASSED_UPSTREAM.id}:{e.keyword}",
                               cause=cause, fix=fix, versions=f"{who} (read from its installed source)")


def _detail(e: UnexpectedKeyword, calls: tuple[PassingCall, ...]) -> list[str]:
    out = [f"passed by the installed source at {c.rel}:{c.line} (to {c.callee or '?'}): `{c.code}`"
           for c in calls[:SHOWN_CALLS]]
    if len(calls) > SHOWN_CALLS:
        out.append(f"and {len(calls) - SHOWN_CALLS} more call(s) passing {e.keyword!r}")
    if e.building:
        out.append("being built when it failed (innermost first): " + " <- ".join(e.building))
    return out
