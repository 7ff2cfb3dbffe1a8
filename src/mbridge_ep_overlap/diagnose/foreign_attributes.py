"""An ``AttributeError`` that crosses a package boundary, named from the installed Megatron source.

Megatron code reads an attribute of another package's object, or code uses a name another package's module lacks.

Contract
--------
``object_error(e)`` (an ``attribute_errors.AttributeErrorLine`` on an instance or a class the installed Megatron
source does not define, or one the frame's file imports from another package): None unless the traceback's
innermost frame outside torch is in megatron/core or megatron/bridge and the class is no built-in type. Else a
``Named`` that names the frame (file:line, function, the line it prints); where the installed source has that
function, its line that reads ``.ATTR`` (the one the traceback prints first, else the nearest); the package the
class most likely belongs to, from the imports of that installed file (``from pkg import CLASS``, or ``pkg.CLASS``
through an ``import pkg``; "not known" otherwise); and the cause:

- the read is ``self.ATTR`` in a method of an installed Megatron class: CLASS is a class of the run derived from it,
  whose construction did not set what the Megatron class sets (where it does, ``init_order.assignments``);
- the installed source sets ``.ATTR`` on a receiver of the same name itself (``R.ATTR = ...``, ``setattr(R, "ATTR",
  ...)``): the object reached the read without passing through that code;
- else an API mismatch: "Megatron-Core VERSION reads CLASS.ATTR at FILE:LINE; the run's PKG CLASS has no such
  attribute: the installed PKG is a version this Megatron-Core was not written against"; the fix pairs the versions
  (what the installed megatron-core / megatron-bridge require of PKG, ``installed_modules.megatron_requires``).

Confidence ``FRAME_CONFIDENCE`` with the installed function's line reading ``.ATTR`` found, ``PLAIN_CONFIDENCE``
otherwise.

``module_error(e)`` (a module outside megatron): the calling frame (the innermost outside torch) and the line it
prints; whether the module is installed here (``installed_modules``, nothing imported) and whether the name is in
that copy (the line defining it and the ``if`` / ``try`` around it; a source that makes names at run time: not
known); the installed Megatron source lines that reference ``MODULE.NAME`` (through each file's imports, or
``from MODULE import NAME``), which tell which side expects it; and the cause "the run's MODULE has no NAME: code
written for another PKG version calls it" (PKG the top-level package; "Python" for a module of the standard
library). A submodule its package does not import, and a partially initialised
module (a circular import), are named as such. ``PLAIN_CONFIDENCE``. Never raises for what is in the lines or the
source.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import re
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import class_source, init_order, installed_modules, upstream_source
from .upstream_checks import UPSTREAM_FRAME

if TYPE_CHECKING:
    from .attribute_errors import AttributeErrorLine

FRAME_CONFIDENCE = 0.5
PLAIN_CONFIDENCE = 0.4
MAX_REFERENCES = 3
BUILTIN_TYPES = frozenset({t.__name__ for t in vars(builtins).values() if isinstance(t, type)}
                          | {t.__name__ for t in vars(types).values() if isinstance(t, type)}
                          | {"NoneType", "ellipsis", "NotImplementedType", "function", "method"})
"""Classes of Python itself: an attribute missing on one (``'NoneType' object``) is a value, not a version, error."""
SOURCE = "installed:mbridge_ep_overlap/diagnose/foreign_attributes.py"


@dataclass
class Named:
    cause: str
    fix: str
    confidence: float
    version: str
    """The installed distribution read ('megatron-core 0.19.2', or the module's own)."""
    source: str
    detail: list[str] = field(default_factory=list)


def _product(version: str) -> str:
    """'Megatron-Core 0.19.2' for 'megatron-core 0.19.2'."""
    name, _, number = version.partition(" ")
    return "-".join(w.capitalize() for w in name.split("-")) + (f" {number}" if number else "")


def _relative(path: str) -> str:
    return "megatron/" + path.split("/megatron/", 1)[-1] if "/megatron/" in path else path


def _frame_words(frame: tuple[str, int, str, str]) -> str:
    return f"{_relative(frame[0])}:{frame[1]} in {frame[2]}" + (f": `{frame[3]}`" if frame[3] else "")


# ---- an attribute of another package's object, read by Megatron code ---------------------------------------

def megatron_frame(e: AttributeErrorLine) -> tuple[str, int, str, str] | None:
    """The frame that read the attribute, when it is Megatron-Core's or Megatron-Bridge's."""
    f = e.reading_frame()
    return f if f is not None and UPSTREAM_FRAME.search(f[0].replace("\\", "/")) else None


def foreign_import(rel: str, name: str) -> tuple[str, int, str] | None:
    """(package, line, how) when the installed file takes class NAME from another package, else None."""
    tree = upstream_source.parsed(rel)
    if tree is None:
        return None
    imported = class_source._imports(rel)
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and not n.level and n.module and not n.module.startswith("megatron"):
            if any(a.name == name for a in n.names):
                found.append((n.lineno, n.module.split(".")[0], f"from {n.module} import {name}"))
        elif isinstance(n, ast.Attribute) and n.attr == name:
            root = _root(n.value)
            origin = imported.get(root or "", "")
            if origin and not origin.startswith("megatron"):
                found.append((n.lineno, origin.split(".")[0], ast.unparse(n)))
    if not found:
        return None
    line, package, how = min(found)
    return package, line, how


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _functions(tree: ast.AST, name: str) -> list[tuple[ast.AST, list[ast.AST]]]:
    """(the function, its enclosing nodes outermost first) of every def named ``name`` (the module for ``<module>``)."""
    if name == "<module>":
        return [(tree, [])]
    out = []

    def visit(node: ast.AST, outer: list[ast.AST]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == name:
                out.append((child, outer))
            visit(child, outer + [child] if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  else outer)

    visit(tree, [])
    return out


def _reads(fn: ast.AST, attr: str) -> list[ast.Attribute]:
    """The ``X.ATTR`` reads in a function's own code (not in the functions and classes it defines)."""
    out, todo = [], list(ast.iter_child_nodes(fn))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.ctx, ast.Load):
            out.append(n)
        todo += list(ast.iter_child_nodes(n))
    return sorted(out, key=lambda n: (n.lineno, n.col_offset))


@dataclass
class _Read:
    line: int
    text: str
    receiver: str
    method_of: str
    """The class whose method the function is ('' for a plain function)."""


def installed_read(rel: str, frame: tuple[str, int, str, str], attr: str) -> tuple[_Read | None, str]:
    """The installed line of the frame's function that reads ``.attr``, and why none when there is none."""
    tree = upstream_source.parsed(rel)
    if tree is None:
        return None, f"{rel} is not in the installed source"
    fns = _functions(tree, frame[2])
    if not fns:
        return None, f"{rel} of the installed source has no function {frame[2]}"
    rows = class_source.text(rel).splitlines()
    printed = " ".join(frame[3].split())

    def shown(n: ast.AST) -> str:
        return " ".join(rows[n.lineno - 1].split()) if 0 < n.lineno <= len(rows) else ""

    candidates = [(fn, outer, n) for fn, outer in fns for n in _reads(fn, attr)]
    if not candidates:
        return None, f"{frame[2]} in the installed {rel} reads no .{attr}"
    fn, outer, n = min(candidates, key=lambda c: (not printed or shown(c[2]) != printed, abs(c[2].lineno - frame[1])))
    owner = outer[-1].name if outer and isinstance(outer[-1], ast.ClassDef) else ""
    return _Read(n.lineno, shown(n), ast.unparse(n.value), owner), ""


def _printed_receiver(frame: tuple[str, int, str, str], attr: str) -> str:
    m = re.search(rf"([A-Za-z_][\w.]*)\.{re.escape(attr)}\b", frame[3])
    return m.group(1) if m else ""


def _sets_itself(receiver: str, attr: str, keep: int = 3) -> list[str]:
    """Where the installed source sets ``.attr`` on a receiver of the same (last) name: ``R.attr = ...``."""
    last = receiver.rsplit(".", 1)[-1]
    if not re.fullmatch(r"[A-Za-z_]\w*", last) or last in ("self", "cls"):
        return []
    a = re.escape(attr)
    pattern = re.compile(rf"(?<![\w.])(?:[\w.]+\.)?{re.escape(last)}\.{a}\s*(?:=(?!=)|:[^=\n]+=(?!=))"
                         rf"|setattr\(\s*(?:[\w.]+\.)?{re.escape(last)}\s*,\s*[\"']{a}[\"']")
    out = []
    for rel, source in upstream_source.sources():
        if attr not in source or (m := pattern.search(source)) is None:
            continue
        out.append(f"{rel}:{source.count(chr(10), 0, m.start()) + 1}")
        if len(out) >= keep:
            break
    return out


def object_error(e: AttributeErrorLine) -> Named | None:
    frame = megatron_frame(e)
    if frame is None or e.owner in BUILTIN_TYPES or e.kind == "module":
        return None
    rel = _relative(frame[0])
    version = upstream_source.installed_version(rel)
    product = _product(version)
    read, why = installed_read(rel, frame, e.attr)
    origin = foreign_import(rel, e.owner) if rel in class_source._files() else None
    package = origin[0] if origin else ""
    at = f"{rel}:{frame[1]}"
    detail = [f"read in the run at {_frame_words(frame)}"]
    detail.append(f"the installed {version} reads it at {rel}:{read.line} in {frame[2]}: `{read.text}`" if read else
                  f"not found in the installed {version}: {why} (the run's Megatron is another version)")
    sure = FRAME_CONFIDENCE if read else PLAIN_CONFIDENCE
    receiver = read.receiver if read else _printed_receiver(frame, e.attr)
    if read and read.receiver == "self" and read.method_of:
        return _derived(e, read, rel, frame, version, sure, detail)
    detail.append(f"{e.owner}: most likely {package}'s ({rel}:{origin[1]}: `{origin[2]}`)" if origin else
                  f"{e.owner}: package not known ({rel} of the installed source does not import it)")
    if sets := _sets_itself(receiver, e.attr):
        detail.append(f"{receiver.rsplit('.', 1)[-1]}.{e.attr} set at: {', '.join(sets)}")
        cause = (f"{product} sets {e.attr} on such objects itself ({', '.join(sets)}) and reads it at {at} ({frame[2]}): "
                 f"this {e.owner} reached the read without passing through the code that sets it (made, copied or "
                 "wrapped elsewhere)")
        fix = (f"make the object through the {product.split(' ')[0]} code that sets {e.attr} ({sets[0]}), or find what "
               "the configuration skips there")
        return Named(cause, fix, sure, version, _source(rel), detail)
    return _mismatch(e, package, rel, at, frame, version, sure, detail)


def _mismatch(e: AttributeErrorLine, package: str, rel: str, at: str, frame, version: str, sure: float,
              detail: list[str]) -> Named:
    product = _product(version)
    name = product.split(" ")[0]
    if package:
        here = installed_modules.version(package)
        detail.append(f"{package} installed here: {here}" if here else f"{package}: not installed here")
        cause = (f"{product} reads {e.owner}.{e.attr} at {at} ({frame[2]}); the run's {package} {e.owner} has no such "
                 f"attribute: the installed {package} is a version this {name} was not written against (API mismatch)")
        wants = installed_modules.megatron_requires(package)
        want = (f"the {package} the installed {version} requires ({'; '.join(wants)})" if wants else
                f"the {package} release the installed {version} was written against (its requirements name no "
                f"{package} version: the release of its time)")
        fix = f"pair the versions: {want}, or a {name} that matches the run's {package}"
    else:
        cause = (f"{product} reads {e.owner}.{e.attr} at {at} ({frame[2]}); the run's {e.owner} (its package not known) "
                 f"has no such attribute: its package is a version this {name} was not written against (API mismatch)")
        fix = (f"pair the versions: the release of {e.owner}'s package this {name} was written against, or a {name} "
               "that matches the run's")
    return Named(cause, fix, sure, version, _source(rel), detail)


def _source(rel: str) -> str:
    return f"installed:{rel}" if rel in class_source._files() else SOURCE


def _derived(e: AttributeErrorLine, read: _Read, rel: str, frame, version: str, sure: float, detail: list[str]) -> Named:
    product = _product(version)
    base = next((c for c in class_source.classes(read.method_of) if c.file == rel), None)
    sets = init_order.assignments(base, e.attr) if base else []
    where = f" ({sets[0].where} in {sets[0].owner.name}.{sets[0].method})" if sets else ""
    cause = (f"{e.owner} is no class of the installed {version} but runs {read.method_of}.{frame[2]} ({rel}:{read.line}), "
             f"which reads self.{e.attr}: a class of the run derived from {read.method_of}, whose construction did not "
             f"set what {read.method_of} sets{where}")
    fix = (f"have {e.owner}.__init__ call {read.method_of}.__init__ (super().__init__) before it is used, or set "
           f"self.{e.attr} as {product} does{where}")
    return Named(cause, fix, sure, version, _source(rel), detail)


# ---- a name another package's module lacks --------------------------------------------------------------

def megatron_references(module: str, name: str) -> list[tuple[str, int, str]]:
    """(file, line, the line) where the installed Megatron source uses ``module.name``."""
    parent, _, last = module.rpartition(".")
    word, part = re.compile(rf"\b{re.escape(name)}\b"), re.compile(rf"\b{re.escape(last)}\b")
    out = []
    for rel, source in upstream_source.sources():
        # a file that uses module.name spells name, and the module whole or its parent and last part (an alias)
        if name not in source or not (module in source or parent and parent in source and part.search(source)) \
                or not word.search(source) or (tree := upstream_source.parsed(rel)) is None:
            continue
        imported = class_source._imports(rel)
        rows = source.splitlines()
        for n in ast.walk(tree):
            hit = (isinstance(n, ast.ImportFrom) and not n.level and n.module == module and any(a.name == name for a in n.names)
                   or isinstance(n, ast.Import) and any(a.name == f"{module}.{name}" for a in n.names))
            if isinstance(n, ast.Attribute) and n.attr == name and (root := _root(n.value)):
                written = ast.unparse(n.value)
                origin = imported.get(root)
                hit = bool(origin) and (origin + written[len(root):]) == module
            if hit:
                out.append((rel, n.lineno, " ".join(rows[n.lineno - 1].split()) if n.lineno <= len(rows) else ""))
    return sorted(set(out))


def module_error(e: AttributeErrorLine) -> Named | None:
    if e.kind != "module" or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", e.owner) or not e.attr:
        return None
    top = e.owner.split(".")[0]
    frame = e.reading_frame()
    called = f" ({_frame_words(frame)})" if frame else ""
    detail = [f"called at {_frame_words(frame)}"] if frame else []
    loc = installed_modules.locate(e.owner)
    here = installed_modules.version(e.owner) if loc.kind != "missing" else ""
    refs = megatron_references(e.owner, e.attr)
    source = f"installed:{loc.rel}" if loc.kind == "source" else f"installed:{refs[0][0]}" if refs else SOURCE
    if e.partial:
        cause = (f"the run's {e.owner} was read while partially initialised (a circular import): {e.attr} was not yet "
                 f"defined when the code used it{called}")
        return Named(cause, f"import {e.owner} (or what needs {e.attr}) later, inside the function that uses it: break "
                     "the circular import", PLAIN_CONFIDENCE, here or e.owner, source, detail)
    if loc.kind in ("source", "namespace") and e.attr not in installed_modules.top_level(installed_modules.tree(loc)) \
            and installed_modules.submodule(loc, e.attr):
        cause = (f"{e.attr} is a submodule of {e.owner} that the package does not import: `import {e.owner}` alone does not "
                 f"load it{called}")
        return Named(cause, f"import {e.owner}.{e.attr} explicitly", PLAIN_CONFIDENCE, here or e.owner, source, detail)
    copy, near = _installed_copy(e, loc, here)
    detail.append(copy)
    if refs:
        version = upstream_source.installed_version(refs[0][0])
        detail.append(f"the installed {version} references {e.owner}.{e.attr} at "
                      + "; ".join(f"{r}:{line}: `{text}`" for r, line, text in refs[:MAX_REFERENCES])
                      + (f" (and {len(refs) - MAX_REFERENCES} more)" if len(refs) > MAX_REFERENCES else "")
                      + f": this {_product(version).split(' ')[0]} expects a {top} that has it")
    else:
        detail.append(f"the installed megatron-core / megatron-bridge do not reference {e.owner}.{e.attr}: the calling "
                      "code, not this Megatron, expects it")
    product = "Python" if top in sys.stdlib_module_names else top
    cause = f"the run's {e.owner} has no {e.attr}: code written for another {product} version calls it{called}"
    wants = installed_modules.megatron_requires(top)
    fix = (f"use the {product} release the calling code was written for, or change the call to the run's {product} API"
           + (f" (nearest in the installed copy: {', '.join(near)})" if near else "")
           + (f"; the installed {upstream_source.installed_version(refs[0][0])} expects it too ({refs[0][0]}:{refs[0][1]}): "
              f"pair {top} with it" + (f" ({'; '.join(wants)})" if wants else "") if refs else ""))
    return Named(cause, fix, PLAIN_CONFIDENCE, here or e.owner, source, detail)


def _installed_copy(e: AttributeErrorLine, loc: installed_modules.Located, here: str) -> tuple[str, list[str]]:
    """What the copy installed here says of the name, and its nearest names."""
    top = e.owner.split(".")[0]
    if loc.kind == "missing":
        return ((f"{top} is installed here ({installed_modules.version(top) or 'version unknown'}) but has no module "
                 f"{e.owner}" if loc.top_installed else
                 f"{top} is not installed here: whether a {top} release has {e.attr} is not known from here"), [])
    if loc.kind != "source":
        return f"{e.owner} is installed here ({here or 'version unknown'}) as a {loc.kind} module: its names are not read", []
    tree = installed_modules.tree(loc)
    names = installed_modules.top_level(tree)
    if e.attr in names:
        line, guards = names[e.attr]
        when = f", under {' and '.join(guards)}" if guards else ""
        return (f"the copy installed here ({here or 'version unknown'}) defines {e.attr} at {loc.rel}:{line}{when}: the "
                "run imports another copy or version" + (", or that condition was false in the run" if guards else ""), [])
    if why := installed_modules.opaque(tree):
        return (f"the copy installed here ({here or 'version unknown'}, {loc.rel}) makes names at run time ({why}): "
                f"whether it has {e.attr} is not known from its source"), []
    near = difflib.get_close_matches(e.attr, sorted(n for n in names if n != "*"), n=3, cutoff=0.7)
    return (f"the copy installed here ({here or 'version unknown'}, {loc.rel}) has no {e.attr} either"
            + (f" (nearest: {', '.join(near)})" if near else ""), near)
