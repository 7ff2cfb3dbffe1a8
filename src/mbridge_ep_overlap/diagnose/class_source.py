"""The classes of the installed Megatron-Core / Megatron-Bridge source: where a class is defined and its bases.

Contract
--------
``classes(name)``: every class definition of that name in ``upstream_source.sources()`` (a file is parsed, with
``upstream_source``'s cached AST, only when its text defines the name), megatron/core/transformer first, then the
rest of megatron/core, then megatron/bridge. ``mro(cls)``: the class and its bases in method resolution order (C3
over the bases as the source names them, each resolved through the file's imports; a base from another package,
``torch.nn.Module``, stays opaque: ``linear(cls)`` keeps it, as its dotted name, where ``super()`` would reach it).
``methods(cls)``: the methods its body defines. ``class_level(cls, attr)``: where a class body of the MRO defines
ATTR (a method, a property, a class attribute or an enum member). ``resolve(expr, file)``: the class a name of that
file refers to. Everything is computed once per process (cached); never raises for what is in the source (a file
that cannot be parsed is skipped).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field

from . import upstream_source

TRIVIAL_BASES = {"object", "ABC", "Protocol", "Generic", "Enum", "IntEnum", "StrEnum", "NamedTuple"}
"""Opaque bases known to define no ``__init__`` that stops a ``super()`` chain."""


@dataclass(frozen=True)
class ClassInfo:
    name: str
    file: str
    line: int
    node: ast.ClassDef = field(compare=False, repr=False)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _rank(rel: str) -> tuple:
    return (not rel.startswith("megatron/core/transformer/"), not rel.startswith("megatron/core/"), rel)


@functools.lru_cache(maxsize=None)
def classes(name: str) -> tuple[ClassInfo, ...]:
    if not re.fullmatch(r"[A-Za-z_]\w*", name or ""):
        return ()
    defines = re.compile(rf"^\s*class\s+{name}\b", re.MULTILINE)
    found = []
    for rel, source in upstream_source.sources():
        if name in source and defines.search(source) and (tree := upstream_source.parsed(rel)) is not None:
            found += [ClassInfo(name, rel, n.lineno, n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    return tuple(sorted(found, key=lambda c: (_rank(c.file), c.line)))


@functools.lru_cache(maxsize=None)
def _imports(rel: str) -> dict[str, str]:
    """Local name -> the dotted name it was imported as, for the module-level imports of one file."""
    tree = upstream_source.parsed(rel)
    out: dict[str, str] = {}
    package = rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    package = package if rel.endswith("__init__.py") else package.rsplit(".", 1)[0]
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                out[a.asname or a.name] = f"{base}.{a.name}"
    return out


def module_file(dotted: str) -> str | None:
    """The installed file of a dotted module name (``megatron.core.transformer`` -> its ``__init__.py``)."""
    path = dotted.replace(".", "/")
    return next((p for p in (f"{path}.py", f"{path}/__init__.py") if p in _files()), None)


def resolve(expr: ast.expr, rel: str, not_this: ClassInfo | None = None) -> ClassInfo | str:
    """The class a base (or ``Base`` of ``Base.m(self)``) names, or its dotted text when it is not in the source."""
    if isinstance(expr, ast.Subscript):
        expr = expr.value
    written = ast.unparse(expr)
    root, _, rest = written.partition(".")
    origin = _imports(rel).get(root)
    full = (origin + ("." + rest if rest else "")) if origin else ""
    name = (full or written).rsplit(".", 1)[-1]  # ``from x import A as B``: the class is A
    if full and not full.startswith("megatron."):
        return written
    if full and (module := module_file(full.rsplit(".", 1)[0])):
        here = [c for c in classes(name) if c.file == module and c != not_this]
        if here:
            return here[0]
    if not full:
        local = [c for c in classes(name) if c.file == rel and c != not_this]
        if local:
            return local[0]
        if rest:  # an attribute of something neither imported nor defined here
            return written
    named = [c for c in classes(name) if c != not_this]
    return named[0] if named else written


@functools.lru_cache(maxsize=None)
def _bases(cls: ClassInfo) -> tuple[ClassInfo | str, ...]:
    return tuple(resolve(b, cls.file, cls) for b in cls.node.bases)


@functools.lru_cache(maxsize=None)
def linear(cls: ClassInfo, depth: int = 0) -> tuple[ClassInfo | str, ...]:
    """The MRO with the opaque bases in it (as their dotted names)."""
    bases = _bases(cls) if depth < 32 else ()
    seqs = [list(linear(b, depth + 1)) if isinstance(b, ClassInfo) else [b] for b in bases] + [list(bases)]
    out: list[ClassInfo | str] = [cls]
    while any(seqs):
        seqs = [s for s in seqs if s]
        head = next((s[0] for s in seqs if not any(s[0] in t[1:] for t in seqs)), None)
        if head is None:  # no consistent order (an approximated base): depth first, each once
            out += [k for s in seqs for k in s if k not in out]
            break
        out.append(head)
        seqs = [s[1:] if s[0] == head else s for s in seqs]
    return tuple(dict.fromkeys(out))


def mro(cls: ClassInfo) -> tuple[ClassInfo, ...]:
    """The classes of the MRO found in the installed source (opaque bases left out)."""
    return tuple(k for k in linear(cls) if isinstance(k, ClassInfo))


@functools.lru_cache(maxsize=None)
def methods(cls: ClassInfo) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The methods a class body defines, by name."""
    return {n.name: n for n in cls.node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


@functools.lru_cache(maxsize=None)
def text(rel: str) -> str:
    """The source of one installed file ('' when it is not one)."""
    return _files().get(rel, "")


@functools.lru_cache(maxsize=1)
def _files() -> dict[str, str]:
    return dict(upstream_source.sources())


def class_level(cls: ClassInfo, attr: str) -> list[tuple[ClassInfo, int, str]]:
    """(class, line, "method" / "property" / "class attribute") where a class body of the MRO defines ``attr``."""
    out = []
    for k in mro(cls):
        for n in k.node.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == attr:
                prop = any(ast.unparse(d).endswith("property") for d in n.decorator_list)
                out.append((k, n.lineno, "property" if prop else "method"))
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                out.append((k, n.lineno, "class attribute"))
    return out


