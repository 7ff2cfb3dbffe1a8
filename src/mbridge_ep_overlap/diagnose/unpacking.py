"""A call whose result the caller unpacks into another number of names than it gives (``ValueError: too many values to
unpack (expected N)`` / ``not enough values to unpack (expected N, got M)``), read against what the installed
Megatron-Core / Megatron-Bridge function of that name gives.

Contract
--------
``Unpacking.feed(text, where)`` keeps (at most ``MAX_ERRORS``) each unpacking ``ValueError`` (torchrun's ``[rankN]:``
optional) with the source line the traceback printed above it (within ``LOOKBACK`` lines, caret lines skipped) when
that line unpacks a call: ``for A, B in X.f(...)`` / ``A, B = X.f(...)`` - the called function ``f`` and the names.
``findings(errors)`` gives one ``unpack-mismatch:f`` finding each (``UNPACK_MISMATCH``, ``signatures.config_error``):
what the installed function of that name gives, read from its source without importing it (``gives``: the
``NamedTuple`` or tuple its return annotation names - an ``Iterable`` / ``Iterator`` / ``Generator`` of it for a
generator -, else the tuples its ``return`` / ``yield`` statements build), and the verdict: the installed function
gives as many values as the caller expects (the run's release of the package gives another number: caller and
package are from different releases) or another number (the caller was written for another release than the
installed one), with the fix in those terms. A call no installed function of that name is found for, whose
installed definitions disagree, or of a builtin's or common method's name (``COMMON``) is named with the caller's line
alone, at ``UNPLACED_CONFIDENCE``. Never raises for what is in the lines.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections import deque
from dataclasses import dataclass

from . import upstream_source
from .report import Finding
from .signatures.config_error import UNPACK_MISMATCH

MAX_ERRORS = 4
LOOKBACK = 4
CONFIDENCE = 0.6
UNPLACED_CONFIDENCE = 0.4
_RANK = r"^\s*(?:\[(?:rank|default)\d+\]:\s*)*"
MESSAGE = re.compile(_RANK + r"ValueError: (?:(?P<many>too many)|not enough) values to unpack \(expected (?P<expected>\d{1,6})"
                     r"(?:, got (?P<got>\d{1,6}))?\)")
CALL = re.compile(_RANK + r"(?:for\s+)?\(?(?P<names>[A-Za-z_]\w*(?:\s*,\s*[A-Za-z_*]\w*)+)\)?\s*(?:=|\bin\b)\s*"
                  r"(?P<callee>[\w.\[\]()]*?)(?P<function>[A-Za-z_]\w*)\s*\(")
CALL_TEXT = 400
"""A source line is read for its call up to this many characters."""
COMMON = frozenset({"items", "keys", "values", "split", "rsplit", "partition", "rpartition", "splitlines", "zip",
                    "enumerate", "divmod", "get", "pop", "popitem", "chunk", "unbind", "topk", "max", "min", "sort",
                    "sorted", "map", "tuple", "list", "iter", "next", "readline", "shape", "size", "groupby"})
"""Builtins and methods of dicts, strings and tensors: a call of these names is no Megatron function's."""
_CARETS = re.compile(r"^\s*(?:\[(?:rank|default)\d+\]:\s*)*[\^~\s]+$")


@dataclass
class UnpackError:
    where: str
    text: str
    expected: int
    too_many: bool
    got: int | None = None
    call: str = ""
    function: str = ""
    names: tuple[str, ...] = ()


class Unpacking:
    def __init__(self) -> None:
        self.errors: list[UnpackError] = []
        self._recent: deque[str] = deque(maxlen=LOOKBACK)

    def feed(self, text: str, where: str) -> None:
        if "values to unpack" in text and (m := MESSAGE.search(text)) is not None and len(self.errors) < MAX_ERRORS:
            e = UnpackError(where, text.strip(), int(m["expected"]), bool(m["many"]), int(m["got"]) if m["got"] else None)
            if any(o.text == e.text for o in self.errors):
                self._recent.clear()
                return
            for line in reversed(self._recent):
                if (c := CALL.search(line[:CALL_TEXT])) is not None:
                    e.call, e.function = line.strip(), c["function"]
                    e.names = tuple(n.strip() for n in c["names"].split(","))
                    break
            self.errors.append(e)  # a repeat of the same error text returned above
            self._recent.clear()
            return
        if text.strip() and not (("^" in text or "~" in text) and _CARETS.match(text)):
            self._recent.append(text)

    def finish(self) -> None:
        self._recent.clear()


@dataclass(frozen=True)
class Gives:
    rel: str
    line: int
    count: int
    what: str
    """``HFWeightTuple (param_name, weight)`` / ``a tuple of 3``."""


def gives(function: str) -> list[Gives]:
    """What each installed function of that name gives, where its source says; empty for a builtin's or a common
    method's name (``COMMON``)."""
    if function in COMMON:
        return []
    out = []
    for rel in upstream_source.defining_files(function):
        tree = upstream_source.parsed(rel)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
                g = _annotated(node, tree, rel) or _built(node, rel)
                if g is not None:
                    out.append(g)
    return out


_WRAPPERS = {"Iterable", "Iterator", "Generator", "AsyncIterator", "AsyncIterable", "AsyncGenerator"}


def _annotated(fn: ast.FunctionDef, tree: ast.AST, rel: str) -> Gives | None:
    ann = fn.returns
    if isinstance(ann, ast.Subscript) and _name(ann.value) in _WRAPPERS:
        inner = ann.slice.elts[0] if isinstance(ann.slice, ast.Tuple) else ann.slice
        ann = inner
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # a forward reference: "HFWeightTuple"
        try:
            ann = ast.parse(ann.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(ann, ast.Subscript) and _name(ann.value) in ("tuple", "Tuple"):
        elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if not any(isinstance(e, ast.Constant) and e.value is Ellipsis for e in elts):
            return Gives(rel, fn.lineno, len(elts), f"a tuple of {len(elts)} ({ast.unparse(ann)})")
    if isinstance(ann, ast.Name):
        fields = _named_tuple_fields(ann.id)
        if fields is not None:
            return Gives(rel, fn.lineno, len(fields), f"{ann.id} ({', '.join(fields)})")
    return None


def _built(fn: ast.FunctionDef, rel: str) -> Gives | None:
    """The one tuple size its own ``return`` / ``yield`` statements build (nested functions left out)."""
    sizes = set()
    for node in _own_nodes(fn):
        value = node.value if isinstance(node, (ast.Return, ast.Yield)) else None
        if isinstance(value, ast.Tuple):
            sizes.add(len(value.elts))
        elif value is not None:
            return None  # something other than a tuple literal: not known from the source alone
    if len(sizes) == 1:
        n = sizes.pop()
        return Gives(rel, fn.lineno, n, f"a tuple of {n} (its return / yield statements)")
    return None


def _own_nodes(fn: ast.FunctionDef):
    stack = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _named_tuple_fields(cls: str) -> tuple[str, ...] | None:
    pattern = re.compile(rf"^class {re.escape(cls)}\((?:typing\.)?NamedTuple\):", re.MULTILINE)
    for rel, text in upstream_source.sources():
        if cls in text and pattern.search(text):
            tree = upstream_source.parsed(rel)
            for node in ast.walk(tree) if tree else ():
                if isinstance(node, ast.ClassDef) and node.name == cls:
                    return tuple(s.target.id for s in node.body
                                 if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name))
    return None


def findings(errors: list[UnpackError]) -> list[Finding]:
    out = []
    for e in errors:
        said = (f"more than {e.expected}" if e.too_many else f"{e.got}" if e.got is not None else f"fewer than {e.expected}")
        found = gives(e.function) if e.function else []
        installed = found if len({g.count for g in found}) == 1 else []  # definitions that disagree place nothing
        if not e.function:
            cause = (f"Code unpacks a value into {e.expected} names and the value has {said}: a call's result is read "
                     "in the layout of another release of the code that produced it.")
            fix = "see the traceback's line above the error for the call; use the release of its package the caller was written for"
        elif not installed:
            cause = (f"The caller unpacks what {e.function}() gives into {e.expected} names ({', '.join(e.names)}), "
                     f"and it gave {said}: either the caller was written for another release of the package that "
                     f"defines {e.function}, or {e.function} gives another layout in some cases (a branch that returns "
                     "fewer values); no installed Megatron-Core / Megatron-Bridge function of that name says which.")
            fix = (f"read what the run's {e.function} returns on this path; use the release of its package the caller "
                   "was written for, or unpack what it gives")
        else:
            g = installed[0]
            version = upstream_source.installed_version(g.rel)
            fits = g.count == e.expected
            cause = (f"The caller unpacks what {e.function}() gives into {e.expected} names ({', '.join(e.names)}), and "
                     f"the run's {e.function} gave {said}. In the installed {version} it ({g.rel}:{g.line}) gives "
                     f"{g.what}: "
                     + ("the caller fits the installed release, so if the run used another release of the package, "
                        "caller and package are from different releases (a version skew); if it ran on these "
                        "packages, another function of that name gave the values." if fits else
                        f"{g.count} values, so the caller was written for another release than the installed one "
                        "(a version skew)."))
            fix = (f"run the caller with {version} (the release whose {e.function} gives {e.expected} values), or "
                   f"unpack what the run's release gives" if fits else
                   f"unpack the {g.count} values the installed {e.function} gives ({g.what}), or use the release the "
                   "caller was written for")
        sig = dataclasses.replace(UNPACK_MISMATCH, id=f"{UNPACK_MISMATCH.id}:{e.function or 'value'}", cause=cause,
                                  fix=fix, confidence=CONFIDENCE if installed else UNPLACED_CONFIDENCE)
        f = Finding(sig)
        f.add(f"{e.where}: {e.text}")
        if e.call:
            f.detail.append(f"unpacked at: {e.call}")
        out.append(f)
    return out
