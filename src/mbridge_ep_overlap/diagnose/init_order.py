"""Initialisation order: where an installed Megatron class sets ``self.ATTR``, and what reads it before that.

What construction reads before the assignment has run is the initialisation-order bug an ``AttributeError`` reveals.

Contract
--------
``assignments(cls, attr)``: every ``self.ATTR = ...`` / ``setattr(self, "ATTR", ...)`` in the methods of the
class's MRO (``class_source.mro``), with the ``if`` tests around it. ``early_reads(cls, attr)``: the paths by
which ``cls(...)`` reads ``self.ATTR`` before an assignment of it has run. Construction starts at the first
``__init__`` of the MRO and follows, in source order (``method_events.events``), ``super().m(...)``,
``Base.m(self, ...)`` and ``self.m(...)`` (resolved on ``cls``'s MRO, as at run time; a ``super().__init__`` that
reaches an opaque base such as ``torch.nn.Module`` ends there) up to ``MAX_DEPTH`` calls deep. An assignment on
the path with no condition ends the search (an ``if c`` and its ``else`` that both set it make one), one under
conditions covers the later reads under the same tests (``method_events.Event.conditions``: a test a ``raise`` above
it adds is none); a read under ``hasattr(self, "ATTR")`` is no error, nor one of a name a class body of the MRO
defines (a method, a class attribute). Each path is its ``Step`` s (file:line, ``Class.method``, the call or the
read, the tests that choose it: its ``Event.conditions``, less a ``hasattr(self, "m")`` that ``cls`` always meets) and ends at the read; at
most ``MAX_PATHS``. ``instance_names(cls)`` lists what the MRO sets on ``self`` or defines in a class body (the
nearest names of a missing one). Never raises for what is in the source.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .class_source import TRIVIAL_BASES, ClassInfo, class_level, linear, methods, mro, resolve
from .method_events import Event, events

MAX_DEPTH = 8
MAX_PATHS = 4
_HASATTR = re.compile(r"""hasattr\(\s*(\w+)\s*,\s*["'](\w+)["']\s*\)""")


@dataclass(frozen=True)
class Step:
    file: str
    line: int
    function: str
    """``Class.method``."""
    action: str
    """The call as the source writes it (``self.create_mcore_cudagraph_manager(config)``), or ``reads self.ATTR``."""
    guards: tuple[str, ...] = ()
    """The tests (source text) that choose this step, outermost first: the ``if`` s around it and above it that
    return (an ``assert`` or an ``if ...: raise`` above it is a requirement every path past it meets, left out)."""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Assignment:
    owner: ClassInfo
    method: str
    line: int
    guards: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.owner.file}:{self.line}"


def assignments(cls: ClassInfo, attr: str) -> list[Assignment]:
    return [Assignment(k, m, e.line, e.guards) for k in mro(cls) for m in methods(k) for e in events(k, m)
            if e.kind == "store" and e.name == attr]


def instance_names(cls: ClassInfo) -> set[str]:
    names = {e.name for k in mro(cls) for m in methods(k) for e in events(k, m) if e.kind == "store"}
    for k in mro(cls):
        names |= set(methods(k))
        names |= {t.id for n in k.node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return names


def _target(cls: ClassInfo, owner: ClassInfo, e: Event) -> tuple[ClassInfo, str] | None:
    """The method a call runs when ``cls`` is the object's class."""
    if e.kind == "self":
        return next(((k, e.name) for k in mro(cls) if e.name in methods(k)), None)
    if e.kind == "super":
        order = linear(cls)
        for k in order[order.index(owner) + 1:] if owner in order else ():
            if isinstance(k, str):
                if e.name == "__init__" and k.rsplit(".", 1)[-1] not in TRIVIAL_BASES:
                    return None  # an opaque base's __init__ (torch.nn.Module's) ends the chain here
            elif e.name in methods(k):
                return k, e.name
        return None
    if e.kind == "class":
        try:
            base = resolve(ast.parse(e.base, mode="eval").body, owner.file)
        except SyntaxError:
            return None
        if isinstance(base, ClassInfo):
            return next(((k, e.name) for k in mro(base) if e.name in methods(k)), None)
    return None


def _open(cls: ClassInfo, guards: tuple[str, ...]) -> tuple[str, ...]:
    """The guards less those ``cls`` always meets: ``hasattr(self, "m")`` for a method ``m`` its MRO defines."""
    known = {m for k in mro(cls) for m in methods(k)}
    return tuple(g for g in guards if not ((m := _HASATTR.fullmatch(g)) and m.group(2) in known))


def _safe(guards: tuple[str, ...], attr: str) -> bool:
    """A test on the path makes sure the attribute is there (``hasattr(self, "attr")``, not negated)."""
    return any((m := _HASATTR.search(g)) and m.group(2) == attr and not g.startswith("not (") for g in guards)


def _merged(stored: list[frozenset[str]], new: frozenset[str]) -> None:
    """Add the tests of an assignment; two that differ in one test and its negation (``if c`` / ``else``, each
    calling a ``super().__init__`` that sets it) make the tests they share."""
    todo = [new]
    while todo:
        s = todo.pop()
        if s in stored:
            continue
        stored.append(s)
        for t in list(stored):
            a, b = s - t, t - s
            if len(a) == 1 and len(b) == 1 and _opposite(next(iter(a)), next(iter(b))):
                todo.append(s & t)


def _opposite(a: str, b: str) -> bool:
    return a == f"not ({b})" or b == f"not ({a})" or a == f"not {b}" or b == f"not {a}"


def early_reads(cls: ClassInfo, attr: str) -> list[tuple[Step, ...]]:
    first = next((k for k in mro(cls) if "__init__" in methods(k)), None)
    paths: list[tuple[Step, ...]] = []
    if first is None or class_level(cls, attr):
        return paths  # a method, property or class attribute is there before __init__ runs
    stored: list[frozenset[str]] = []
    """The conditions under which an assignment has run so far (an empty set: it has run on every path)."""

    def scan(owner: ClassInfo, method: str, path: tuple[Step, ...], outer: tuple[tuple[str, ...], tuple[str, ...]],
             seen: frozenset) -> bool:
        """Walk one method; True once an assignment of ``attr`` has run on every path (nothing after it counts).
        ``outer``: the guards and the conditions of the calls that led here."""
        function = f"{owner.name}.{method}"
        for e in events(owner, method):
            guards, conditions = outer[0] + e.guards, outer[1] + e.conditions
            if len(paths) >= MAX_PATHS:
                return True
            if e.kind in ("store", "set-on-every-path") and e.name == attr:
                _merged(stored, frozenset(conditions))
                if frozenset() in stored:
                    return True
            elif e.kind == "read" and e.name == attr:
                if not _safe(guards, attr) and not any(s <= set(guards) for s in stored):
                    paths.append(path + (Step(owner.file, e.line, function, f"reads self.{attr}", _open(cls, e.conditions)),))
            elif e.kind in ("self", "super", "class") and len(path) < MAX_DEPTH \
                    and (target := _target(cls, owner, e)) and target not in seen:
                step = Step(owner.file, e.line, function, e.text, _open(cls, e.conditions))
                if scan(*target, path + (step,), (guards, conditions), seen | {target}):
                    return True
        return False

    scan(first, "__init__", (), ((), ()), frozenset({(first, "__init__")}))
    return paths
