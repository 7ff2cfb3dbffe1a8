"""A name used where it is not defined (``NameError``, ``UnboundLocalError``): a bug of the release whose code raised
it, not a configuration error; where the installed Megatron-Core / Megatron-Bridge define that name.

Contract
--------
``NameErrors.feed(text, where)`` keeps each ``NameError: name 'X' is not defined`` (also ``free variable 'X' referenced
before assignment``) and ``UnboundLocalError: cannot access local variable 'X' ...`` / ``local variable 'X' referenced
before assignment`` (torchrun's ``[rankN]:`` optional), at most ``MAX_ERRORS``, one per name, with the innermost
traceback frame above it (file, line, function) when the log has one. ``findings(errors)`` gives one
``name-error:X`` finding each from the ``NAME_NOT_DEFINED`` row (``signatures.config_error``): the code that raised it (the
frame's file and function, its package from the path), and where the installed megatron-core / megatron-bridge bind
that name (``binding_sites``: the functions that assign it, or the module that defines or imports it; at most
``SHOWN`` files), the frame's own function first, then megatron/core/transformer's, inference code
last. A frame in MCore / MB whose installed function binds the name: the
installed release has it (the run's release has the bug; fixed since). The fix: a release of that package without the
bug (the installed one where it binds the name), or avoiding the code path until then. ``CONFIDENCE`` with a frame,
``UNPLACED_CONFIDENCE`` without. Nothing is imported; never raises for what is in the lines.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from dataclasses import dataclass

from . import upstream_source
from .report import Finding
from .signatures.config_error import NAME_NOT_DEFINED

MAX_ERRORS = 6
SHOWN = 3
CONFIDENCE = 0.55
UNPLACED_CONFIDENCE = 0.45
MESSAGE = re.compile(r"(?:^|[\s:])(?P<kind>NameError|UnboundLocalError): (?:name|free variable|cannot access local variable|"
                     r"local variable) '(?P<name>\w+)'")
FRAME = re.compile(r'^\s*(?:\[(?:rank|default)\d+\]:\s*)*File "(?P<file>[^"]+)", line (?P<line>\d{1,9}), in (?P<function>\S+)')
PACKAGE = re.compile(r"(?:site|dist)-packages/([A-Za-z_]\w*)/|/(megatron)/(?:core|bridge)/")


@dataclass
class UndefinedName:
    kind: str
    name: str
    where: str
    text: str
    frame: tuple[str, int, str] | None = None


@dataclass(frozen=True)
class Binding:
    rel: str
    line: int
    scope: str
    """The function that assigns it, or '<module>'."""


class NameErrors:
    def __init__(self) -> None:
        self.errors: list[UndefinedName] = []
        self._frame: tuple[str, int, str] | None = None

    def feed(self, text: str, where: str) -> None:
        if 'File "' in text and (f := FRAME.match(text)) is not None:
            self._frame = (f["file"], int(f["line"]), f["function"])
        elif "Error" in text and (m := MESSAGE.search(text)) is not None:
            if all(e.name != m["name"] for e in self.errors) and len(self.errors) < MAX_ERRORS:
                self.errors.append(UndefinedName(m["kind"], m["name"], where, text.strip()[:300], self._frame))
            self._frame = None

    def finish(self) -> None:
        self._frame = None


@functools.lru_cache(maxsize=32)
def binding_sites(name: str) -> tuple[Binding, ...]:
    """Where the installed megatron-core / megatron-bridge bind ``name``: functions assigning it, modules defining it."""
    word = re.compile(r"\b" + re.escape(name) + r"\b")
    out = []
    for rel, text in upstream_source.sources():
        if not word.search(text) or (tree := upstream_source.parsed(rel)) is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(node)):
                    out.append(Binding(rel, node.lineno, node.name))
        for node in tree.body if isinstance(tree, ast.Module) else []:
            names = [a.asname or a.name.split(".")[0] for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) \
                else [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else []
            if name in names:
                out.append(Binding(rel, node.lineno, "<module>"))
    return tuple(out)


def _package(path: str) -> str:
    m = PACKAGE.search(path.replace("\\", "/"))
    if m is None:
        return ""
    return "megatron" if m.group(2) else m.group(1)


def findings(errors: list[UndefinedName]) -> list[Finding]:
    out = []
    for e in errors:
        frame = e.frame
        sites = sorted(binding_sites(e.name), key=lambda b: (
            frame is not None and b.scope != frame[2], frame is not None and not frame[0].endswith(b.rel),
            not b.rel.startswith("megatron/core/transformer/"), "/inference/" in b.rel, b.rel, b.line))
        package = _package(frame[0]) if frame else ""
        raised = (f"{frame[0]}:{frame[1]} in {frame[2]}" + (f" ({package})" if package else "")) if frame else \
            "the code that raised it (the log shows no traceback frame)"
        same = next((b for b in sites if frame is not None and frame[0].endswith(b.rel) and b.scope == frame[2]), None)
        cause = (f"{e.kind}: '{e.name}' is used where it is not defined, at {raised}: a bug of that release's code (a "
                 f"typo, a name left over from a refactor, a missing import), not a configuration error.")
        if same is not None:
            cause += (f" The installed {upstream_source.installed_version(same.rel)} binds it in the same function "
                      f"({same.rel}:{same.line}): the run's release has the bug, the installed one not.")
        elif sites:
            files = list(dict.fromkeys(b.rel for b in sites))
            first = {rel: next(b for b in sites if b.rel == rel) for rel in files[:SHOWN]}
            cause += (f" The installed megatron-core / megatron-bridge bind that name in {len(files)} file(s), "
                      + ", ".join(f"{rel}:{b.line} ({b.scope})" for rel, b in first.items())
                      + (" and more" if len(files) > SHOWN else "") + ": the code path that uses it is among them.")
        fix = (f"use a release of {package or 'the package that raised it'} with the bug fixed"
               + (f" (the installed {upstream_source.installed_version(same.rel)} has it)" if same else "")
               + ", or avoid the code path until then (the setting that takes it: the frame's function)")
        sig = dataclasses.replace(NAME_NOT_DEFINED, id=f"{NAME_NOT_DEFINED.id}:{e.name}", cause=cause, fix=fix,
                                  confidence=CONFIDENCE if frame else UNPLACED_CONFIDENCE)
        f = Finding(sig)
        f.add(f"{e.where}: {e.text}")
        f.detail += [f"bound in the installed source at {b.rel}:{b.line} ({b.scope})" for b in sites[:2 * SHOWN]]
        out.append(f)
    return out
