"""An ``AttributeError`` on a Megatron-Core / Megatron-Bridge class or module, named from the installed source.

One that crosses a package boundary (Megatron code reading another package's object, a name another package's
module lacks) is named with ``foreign_attributes``.

Contract
--------
``AttributeErrors.feed(text, where)`` is fed every line of a log; it keeps each ``AttributeError: 'CLASS' object
has no attribute 'ATTR'``, ``type object 'CLASS' has no attribute 'ATTR'`` and ``module 'X' has no attribute 'Y'``
line (torchrun's ``[rankN]:`` prefix removed; anywhere in the line, so a pasted message alone counts) with the
traceback frames above it. ``findings(errors)`` gives one ``attribute-error:CLASS.ATTR`` (or
``attribute-error:MODULE.Y``) finding per error it can name, made from the ``attribute-error`` row
(``signatures.config_error.ATTRIBUTE_ERROR``). A class defined in the installed source (``class_source``):

- the class (several of that name: megatron/core/transformer first, the one a traceback frame is in before
  that; the others listed) or a base sets ``self.ATTR`` in ``__init__`` and constructing it reads ``self.ATTR``
  before that assignment (``init_order.early_reads``): an initialisation-order bug of the installed version,
  the chain of calls with file:line and the ``if`` tests that take the path, at ``CHAIN_CONFIDENCE``;
- it is set elsewhere (another method, or only under an ``if``): where and when, at ``PLAIN_CONFIDENCE``;
- nothing sets or defines it: not in the installed version (renamed or removed), code written for another
  version reads it (the traceback's innermost frame outside torch when the log has one; the nearest names the
  class has), at ``PLAIN_CONFIDENCE``;
- a module ``megatron.*``: whether it is installed, whether the name is defined there (under which ``if`` /
  ``try``), whether it is a submodule its package does not import, where else the installed source defines it.

A class the installed source does not define (or one the reading frame's file imports from another package), read
by a Megatron frame, and any other package's module: ``foreign_attributes.object_error`` / ``module_error`` (an
API mismatch with the package named from the file's imports, at 50% with the installed line that reads it found;
the run's module lacking the name, whether the copy installed here has it, where the installed Megatron references
it). A class of Python itself, or one no Megatron frame reads, is not named.

Never raises for what is in the lines.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field

from . import class_source, foreign_attributes, init_order, installed_modules, upstream_source
from .report import Finding
from .signatures.config_error import ATTRIBUTE_ERROR
from .traceback_frames import Frames, named_findings
from .upstream_checks import PREFIX

CHAIN_CONFIDENCE = 0.6
PLAIN_CONFIDENCE = 0.4
MAX_ERRORS = 8
MESSAGE = re.compile(r"AttributeError: (?:(?P<type>type object )|(?P<partial>partially initialized )?module )?"
                     r"'(?P<owner>\w+(?:\.\w+)*)'(?: object)? has no attribute '(?P<attr>\w+)'")


@dataclass
class AttributeErrorLine:
    owner: str
    """The class (or the module, dotted) the message names."""
    attr: str
    kind: str
    """"object" (an instance), "type" (the class itself) or "module"."""
    where: str
    line: str
    frames: list[tuple[str, int, str, str]] = field(default_factory=list)
    """(file, line, function, source line) of the traceback above it, outermost first."""
    partial: bool = False
    """The module was partially initialised (Python says so: a circular import)."""

    @property
    def key(self) -> str:
        return f"{self.owner}.{self.attr}"

    def reading_frame(self) -> tuple[str, int, str, str] | None:
        """The innermost frame outside torch (``nn.Module.__getattr__`` raises for every module's read)."""
        return next((f for f in reversed(self.frames) if "/torch/" not in f[0]), None)


class AttributeErrors:
    def __init__(self) -> None:
        self.errors: list[AttributeErrorLine] = []
        self._frames = Frames()

    def feed(self, text: str, where: str) -> None:
        if self._frames.start_or_frame(text):
            return
        if "AttributeError: " in text and (m := MESSAGE.search(text)):
            kind = "type" if m.group("type") else "module" if " module '" in m.group(0) else "object"
            frames = self._frames.take()
            if len(self.errors) < MAX_ERRORS and all(e.key != f"{m.group('owner')}.{m.group('attr')}" for e in self.errors):
                self.errors.append(AttributeErrorLine(m.group("owner"), m.group("attr"), kind, where,
                                                      PREFIX.sub("", text).strip()[:300], frames,
                                                      bool(m.group("partial"))))
        else:
            self._frames.other(text)


def findings(errors: list[AttributeErrorLine]) -> list[Finding]:
    return named_findings(errors, lambda e: _module(e) if e.kind == "module" else _class(e))


def _relative(path: str) -> str:
    return "megatron/" + path.split("/megatron/", 1)[-1] if "/megatron/" in path else path


def _frame_words(e: AttributeErrorLine) -> str:
    f = e.reading_frame()
    return f"{_relative(f[0])}:{f[1]} in {f[2]}" + (f": `{f[3]}`" if f[3] else "") if f else ""


def _signature(e: AttributeErrorLine, cause: str, fix: str, sure: float, version: str, source: str):
    return dataclasses.replace(ATTRIBUTE_ERROR, id=f"{ATTRIBUTE_ERROR.id}:{e.key}", cause=cause, fix=fix,
                               confidence=sure, source=f"installed:{source}", versions=f"the installed {version}")


def _pick(e: AttributeErrorLine, found: tuple[class_source.ClassInfo, ...]) -> class_source.ClassInfo:
    """The class a traceback frame runs in (its file holds the class or a base), else the first of ``found``."""
    files = {_relative(f[0]) for f in e.frames}
    return next((c for c in found if files & {k.file for k in class_source.mro(c)}), found[0])


def _named(e: AttributeErrorLine, named: foreign_attributes.Named | None):
    if named is None:
        return None
    sig = dataclasses.replace(ATTRIBUTE_ERROR, id=f"{ATTRIBUTE_ERROR.id}:{e.key}", cause=named.cause, fix=named.fix,
                              confidence=named.confidence, source=named.source, versions=f"the installed {named.version}")
    return sig, named.detail


def _class(e: AttributeErrorLine):
    found = class_source.classes(e.owner)
    frame = foreign_attributes.megatron_frame(e)
    if not found or (frame and foreign_attributes.foreign_import(_relative(frame[0]), e.owner)):
        return _named(e, foreign_attributes.object_error(e))  # another package's class, read by Megatron code
    cls = _pick(e, found)
    version = upstream_source.installed_version(cls.file)
    detail = [f"class {cls.name}: {cls.where}" + (f" (also defined at {', '.join(c.where for c in found if c != cls)})"
                                                  if len(found) > 1 else "")]
    if frame := _frame_words(e):
        detail.append(f"read in the run at {frame}")
    sets = init_order.assignments(cls, e.attr)
    level = class_source.class_level(cls, e.attr)
    if e.kind == "object" and sets:
        return _assigned(e, cls, sets, version, detail)
    if level:
        k, line, what = level[0]
        detail.append(f"{e.attr} is a {what} of {k.name} at {k.file}:{line}")
        cause = (f"{cls.name} defines {e.attr} as a {what} ({k.file}:{line}) in the installed {version}, yet the run "
                 "found none: " + ("a property raises AttributeError from inside its getter" if what == "property" else
                                   "the run's class is another version's, or the name was deleted at run time"))
        return _signature(e, cause, f"read the {what} at {k.file}:{line}: what it reads is what is missing",
                          PLAIN_CONFIDENCE, version, cls.file), detail
    if e.kind == "type" and sets:
        s = sets[0]
        cause = (f"{e.attr} is set on instances of {cls.name} ({s.where} in {s.owner.name}.{s.method}), not on the class: "
                 "code reads it on the class itself")
        return _signature(e, cause, f"read {e.attr} on an instance of {cls.name}, not on the class",
                          PLAIN_CONFIDENCE, version, s.owner.file), detail
    near = difflib.get_close_matches(e.attr, sorted(init_order.instance_names(cls)), n=3, cutoff=0.7)
    if near:
        detail.append(f"nearest names {cls.name} has: {', '.join(near)}")
    cause = (f"{cls.name} has no attribute {e.attr} in the installed {version} (renamed or removed): code written for "
             "another version reads it" + (f" ({frame})" if frame else ""))
    fix = ("use the release of megatron-core / megatron-bridge the reading code was written for, or change the code to "
           "the installed API" + (f" (nearest: {', '.join(near)})" if near else ""))
    return _signature(e, cause, fix, PLAIN_CONFIDENCE, version, cls.file), detail


def _assigned(e: AttributeErrorLine, cls, sets: list[init_order.Assignment], version: str, detail: list[str]):
    inits = [s for s in sets if s.method == "__init__"]
    first = inits[0] if inits else sets[0]
    sets_words = f"{first.owner.name}.{first.method} sets it at {first.where}"
    detail.append(f"self.{e.attr} set at: " + "; ".join(f"{s.where} in {s.owner.name}.{s.method}"
                                                        + (f" when {' and '.join(s.guards)}" if s.guards else "")
                                                        for s in sets[:4]))
    paths = init_order.early_reads(cls, e.attr) if inits else []
    if not paths:
        if first.guards:
            cause = (f"{sets_words}, only when {' and '.join(first.guards)}: a configuration where that is false leaves "
                     f"{cls.name} without {e.attr}")
            fix = f"meet the condition ({' and '.join(first.guards)}), or a release that sets {e.attr} on every path"
        elif first.method != "__init__":
            cause = (f"{sets_words}, not in __init__: code that reads it before {first.owner.name}.{first.method} "
                     "has run finds none")
            fix = f"call {first.method} first, or a release that sets {e.attr} in __init__"
        else:
            cause = (f"{sets_words} on every path and no read during construction comes before it in the installed "
                     f"{version}: the object was made without that __init__, or code of another version reads it")
            fix = "check the version of the reading code against the installed megatron-core / megatron-bridge"
        return _signature(e, cause, fix, PLAIN_CONFIDENCE, version, first.owner.file), detail
    path = paths[0]
    chain = " -> ".join(f"{s.function} ({s.where}) " + ("calls " + s.action if not s.action.startswith("reads ")
                                                         else s.action) for s in path)
    guards = [g for s in path for g in s.guards]
    when = " and ".join(guards) if guards else "on every construction (no if on the path)"
    cause = (f"An initialisation-order bug in the installed {version}: {chain}, before {sets_words}; "
             f"the path is taken when {when}")
    fields = sorted(set(re.findall(r"\bconfig\.(\w+)", " ".join(guards))))
    named = f"they test the config fields {', '.join(fields)}; the cause gives them" if fields else when
    fix = (f"avoid the configuration the path's if tests name ({named}), or use a release where {first.owner.name} "
           f"sets self.{e.attr} before {path[-1].function} reads it")
    for i, s in enumerate(path, 1):
        detail.append(f"step {i}: {s.where} in {s.function}: {s.action}" + (f" (when {' and '.join(s.guards)})"
                                                                              if s.guards else ""))
    if (f := e.reading_frame()) is not None:
        agrees = _relative(f[0]) == path[-1].file and f[1] == path[-1].line
        detail.append("the run's traceback reads it at the same line" if agrees else
                      f"the run's traceback reads it at {_relative(f[0])}:{f[1]} (the installed source: {path[-1].where})")
    detail += [f"also read before it is set: {p[-1].where} in {p[-1].function}, reached from {p[0].where}" for p in paths[1:]]
    return _signature(e, cause, fix, CHAIN_CONFIDENCE, version, path[-1].file), detail


# ---- a module's attribute ------------------------------------------------------------------------------

def _module(e: AttributeErrorLine):
    if not e.owner.startswith("megatron."):  # another package's module (megatron alone: the namespace, not named)
        return _named(e, foreign_attributes.module_error(e)) if e.owner != "megatron" else None
    files = dict(upstream_source.sources())
    path = e.owner.replace(".", "/")
    rel = next((p for p in (f"{path}.py", f"{path}/__init__.py") if p in files), None)
    top = "/".join(path.split("/")[:2])
    if not any(r.startswith(top + "/") for r in files):
        return None  # neither megatron.core nor megatron.bridge: not the installed source's
    version = upstream_source.installed_version(path + "/")
    elsewhere = _defined_elsewhere(e.attr, rel)
    moved = f" (the installed source defines it in {', '.join(elsewhere)})" if elsewhere else ""
    if rel is None:
        cause = f"module {e.owner} is not in the installed {version}: code written for another version reads it{moved}"
        return _signature(e, cause, "use the version the code was written for, or import the name from where the "
                          "installed source has it" + moved, PLAIN_CONFIDENCE, version, f"{top}/__init__.py"), []
    defined = _top_level(rel).get(e.attr)
    sub = f"{path}/{e.attr}"
    if defined is not None:
        line, guards = defined
        when = f", under {' and '.join(guards)}" if guards else ""
        cause = (f"{e.owner} defines {e.attr} at {rel}:{line}{when} in the installed {version}, yet the run found none: "
                 + ("the module was read while partially initialised (a circular import)" if e.partial else
                    "the condition was false in the run" if guards else
                    "the run's copy is another version (one without it), or the module was read while partially "
                    "initialised (a circular import)"))
        fix = ("import the module that needs it later (inside the function), breaking the circular import" if e.partial
               else f"meet the condition ({' and '.join(guards)}) in the run's environment" if guards else
               f"run with the installed {version} (check which copy the run imports), or break the circular import")
        return _signature(e, cause, fix, PLAIN_CONFIDENCE, version, rel), [f"defined at {rel}:{line}{when}"]
    if f"{sub}.py" in files or f"{sub}/__init__.py" in files:
        cause = (f"{e.attr} is a submodule of {e.owner} that {rel} does not import: `import {e.owner}` alone does not "
                 "load it")
        return _signature(e, cause, f"import {e.owner}.{e.attr} explicitly", PLAIN_CONFIDENCE, version, rel), []
    near = difflib.get_close_matches(e.attr, sorted(_top_level(rel)), n=3, cutoff=0.7)
    cause = (f"{e.owner} has no attribute {e.attr} in the installed {version} (renamed or removed): code written for "
             f"another version reads it{moved}" + (f" ({_frame_words(e)})" if e.frames else ""))
    fix = "use the version the code was written for, or the installed name" + (f" (nearest: {', '.join(near)})" if near
                                                                                else "") + moved
    return _signature(e, cause, fix, PLAIN_CONFIDENCE, version, rel), []


def _top_level(rel: str) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Name -> (line, the ``if`` / ``try`` it is defined under) of what a module's top level defines."""
    return installed_modules.top_level(upstream_source.parsed(rel))


def _defined_elsewhere(name: str, rel: str | None, keep: int = 3) -> list[str]:
    pattern = re.compile(rf"^(?:def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*[:=]", re.MULTILINE)
    return [r for r, text in upstream_source.sources() if r != rel and name in text and pattern.search(text)][:keep]
