"""Another package's module as installed here, read without importing it.

Its file, the names its top level defines, the distribution's version, and what the installed Megatron-Core /
Megatron-Bridge require of it.

Contract
--------
``locate(dotted)``: where a dotted module name is installed, as a ``Located``, found part by part with
``importlib.util.find_spec`` for the top-level package and ``importlib.machinery.PathFinder`` below it (so no
package is imported): its ``kind`` ("source": a ``.py`` file whose names can be read; "compiled": an extension,
built-in or frozen module; "namespace"; "missing": not installed here, ``top_installed`` saying whether its
top-level package is), ``path`` and ``rel`` (the path below its site directory, ``packaging/version.py``).
``tree(located)``: its parsed source, or None. ``top_level(tree)``: name -> (line, the ``if`` / ``try`` it is
defined under) of what a module's top level defines (a ``def``, a ``class``, an assignment, an import).
``opaque(tree)``: why the source does not list every name the module has at run time (a ``from X import *``, a
module ``__getattr__``, ``globals()`` at module level), or ''. ``submodule(located, name)``: whether NAME is a module file of that package.
``version(module)``: 'DIST VERSION' of the distribution that installs the module's top-level package, or ''
(``dists(module)``: those distributions; ``version_of(dist)``: its version; ``top_names()``: every top-level name an
installed distribution provides).
``megatron_requires(module)``: the ``Requires-Dist`` lines of the installed megatron-core / megatron-bridge on that
distribution (by the distribution's name, or the module's with ``_`` as ``-``), each with the package that
states it. ``site_relative(path)``: a file's path below its site directory (after ``site-packages/`` or
``dist-packages/``; in a source tree, from the first folder an installed distribution has), or ''.
``distribution_of(rel)``: the installed distribution whose files hold that path's folder (the one with the longest
shared folder among those that install its top-level name), or ''. ``requirement_on(dist, module)``: the
``Requires-Dist`` lines of the installed ``dist`` on the distribution of ``module``; ``pinned(line)``: whether one
bounds the version, ``pin_words(line)``: it in words (no version pinned, its marker). ``elsewhere(dotted)``: the
other modules of the same top-level package named as the last part of ``dotted`` (a module moved or renamed),
from a bounded walk of its folders. Cached; never raises.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
import os
import re
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

MEGATRON_DISTS = ("megatron-core", "megatron-bridge")
_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Located:
    kind: str
    """"source" (a ``.py`` file: its names can be read), "compiled" (an extension, built-in or frozen module),
    "namespace" (a package of folders alone) or "missing" (not installed here)."""
    path: Path | None = None
    """The module's file (a package's ``__init__.py``)."""
    rel: str = ""
    """``path`` below its site directory (``packaging/version.py``), else the dotted name."""
    top_installed: bool = False
    """The top-level package is installed here (a submodule of it may still not be)."""
    locations: tuple[str, ...] = ()
    """A package's folders (where its submodules are)."""


@functools.lru_cache(maxsize=256)
def locate(dotted: str) -> Located:
    parts = dotted.split(".")
    if not all(_NAME.fullmatch(p) for p in parts):
        return Located("missing")
    top = False
    try:
        spec = importlib.util.find_spec(parts[0])
        top = spec is not None
        for i in range(1, len(parts)):
            locations = list(spec.submodule_search_locations or []) if spec else []
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), locations) if locations else None
    except Exception:  # noqa: BLE001 - an installed package's own finder may raise anything; then it is not found
        return Located("missing", top_installed=top)
    if spec is None:
        return Located("missing", top_installed=top)
    locations = tuple(str(p) for p in spec.submodule_search_locations or ())
    if not (spec.has_location and spec.origin):
        return Located("namespace" if locations else "compiled", rel=dotted, top_installed=True, locations=locations)
    path = Path(spec.origin)
    depth = len(parts) if path.name.startswith("__init__.") else len(parts) - 1
    site = path.parents[depth] if len(path.parents) > depth else path.parent
    try:
        rel = path.relative_to(site).as_posix()
    except ValueError:
        rel = path.name
    return Located("source" if path.suffix == ".py" else "compiled", path, rel, True, locations)


@functools.lru_cache(maxsize=64)
def _parsed(path: Path) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def tree(located: Located) -> ast.Module | None:
    return _parsed(located.path) if located.kind == "source" and located.path is not None else None


def top_level(module: ast.AST | None) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Name -> (line, the ``if`` / ``try`` it is defined under) of what a module's top level defines."""
    out: dict[str, tuple[int, tuple[str, ...]]] = {}

    def visit(body: list[ast.stmt], guards: tuple[str, ...]) -> None:
        for n in body:
            names: list[str] = []
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [n.name]
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                names = [e.id for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
                         if isinstance(e, ast.Name)]
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names = [a.asname or a.name.split(".")[0] for a in n.names]
            elif isinstance(n, ast.If):
                visit(n.body, guards + (ast.unparse(n.test),))
                visit(n.orelse, guards + (f"not ({ast.unparse(n.test)})",))
            elif isinstance(n, ast.Try):
                visit(n.body, guards + (f"the try at line {n.lineno} succeeding",))
                for h in n.handlers:
                    visit(h.body, guards + (f"the try at line {n.lineno} failing",))
            for name in names:
                out.setdefault(name, (n.lineno, guards))

    visit(module.body if isinstance(module, ast.Module) else [], ())
    return out


def opaque(module: ast.AST | None) -> str:
    """Why the source does not list every name the module has at run time, or ''."""
    names = top_level(module)
    if "*" in names:
        return f"a `from ... import *` at line {names['*'][0]}"
    if "__getattr__" in names:
        return f"a module __getattr__ at line {names['__getattr__'][0]} (names made when first read)"
    for n in _module_level(module):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "globals":
            return f"globals() at line {n.lineno} (names set at run time)"
    return ""


def _module_level(module: ast.AST | None):
    """The nodes that run when the module is imported (not the bodies of its functions and classes)."""
    todo = list(module.body) if isinstance(module, ast.Module) else []
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo += list(ast.iter_child_nodes(n))


def submodule(located: Located, name: str) -> bool:
    if not _NAME.fullmatch(name):
        return False
    try:
        return any((Path(p) / f"{name}.py").is_file() or (Path(p) / name / "__init__.py").is_file() for p in located.locations)
    except OSError:  # a name too long for a file name, a folder that cannot be read: no such submodule
        return False


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    try:
        return metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - a broken distribution's metadata: no names known
        return {}


def _dists(module: str) -> list[str]:
    return list(dict.fromkeys(_distributions().get(module.split(".")[0], [])))


def top_names() -> frozenset[str]:
    """The top-level names the installed distributions provide (``megatron``, ``packaging``, ...)."""
    return frozenset(_distributions())


def dists(module: str) -> list[str]:
    """The installed distributions that install the module's top-level name."""
    return _dists(module)


def version(module: str) -> str:
    for dist in _dists(module):
        try:
            return f"{dist} {metadata.version(dist)}"
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return ""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.lru_cache(maxsize=64)
def megatron_requires(module: str) -> tuple[str, ...]:
    wanted = {_normal(d) for d in _dists(module)} | {_normal(module.split(".")[0])}
    out = []
    for dist in MEGATRON_DISTS:
        try:
            requires = metadata.requires(dist) or []
        except (metadata.PackageNotFoundError, ValueError):
            continue
        for r in requires:
            if (m := re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r)) and _normal(m.group(0)) in wanted:
                out.append(f"{r} ({dist} {_version_of(dist)})")
    return tuple(dict.fromkeys(out))


def version_of(dist: str) -> str:
    return _version_of(dist)


def _version_of(dist: str) -> str:
    try:
        return metadata.version(dist)
    except (metadata.PackageNotFoundError, ValueError):
        return "version unknown"


@functools.lru_cache(maxsize=256)
def site_relative(path: str) -> str:
    p = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in p:
            return p.rsplit(marker, 1)[1]
    parts = [x for x in p.split("/") if x]
    for i, part in enumerate(parts[:-1]):
        if part in _distributions() and distribution_of("/".join(parts[i:])):
            return "/".join(parts[i:])
    return ""


@functools.lru_cache(maxsize=64)
def _folders(dist: str) -> frozenset[str]:
    try:
        files = metadata.distribution(dist).files or []
    except Exception:  # noqa: BLE001 - a broken distribution's metadata: no files known
        return frozenset()
    return frozenset(str(f.parent).replace("\\", "/") for f in files if not str(f).startswith(".."))


@functools.lru_cache(maxsize=256)
def distribution_of(rel: str) -> str:
    parts = rel.replace("\\", "/").split("/")
    top = parts[0].removesuffix(".py")
    if not _NAME.fullmatch(top):
        return ""
    best, best_depth = "", 0
    for dist in _dists(top):
        folders = _folders(dist)
        depth = next((d for d in range(len(parts) - 1, 0, -1) if "/".join(parts[:d]) in folders), 0)
        if depth == 0 and len(parts) == 1 and "." in folders:
            depth = 1  # a top-level module file
        if depth > best_depth:
            best, best_depth = dist, depth
    return best


def _pinned(requirement: str) -> bool:
    return bool(re.search(r"[<>=~!]", requirement.split(";")[0]))


@functools.lru_cache(maxsize=64)
def requirement_on(dist: str, module: str) -> tuple[str, ...]:
    """The ``Requires-Dist`` lines of ``dist`` on the distribution of ``module`` (its extras' lines last)."""
    if not dist:
        return ()
    wanted = {_normal(d) for d in _dists(module)} | {_normal(module.split(".")[0])}
    if located := distribution_of(locate(module).rel) if locate(module).kind == "source" else "":
        wanted = {_normal(located)}
    try:
        requires = metadata.requires(dist) or []
    except (metadata.PackageNotFoundError, ValueError):
        return ()
    out = [r for r in requires if (m := re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r)) and _normal(m.group(0)) in wanted]
    return tuple(sorted(dict.fromkeys(out), key=lambda r: "extra ==" in r))


def pin_words(requirement: str) -> str:
    """'megatron-core==0.19.2' -> itself; 'megatron-core[dev]' -> 'megatron-core[dev] (no version pinned)'; a
    marker after: 'pkg[extra] (no version pinned) when extra == "x"'."""
    req, _, marker = (x.strip() for x in requirement.partition(";"))
    return (req if _pinned(req) else f"{req} (no version pinned)") + (f" when {marker}" if marker else "")


def pinned(requirement: str) -> bool:
    """Whether a ``Requires-Dist`` line bounds the version (its markers aside)."""
    return _pinned(requirement)


MAX_WALK = 20000


@functools.lru_cache(maxsize=64)
def elsewhere(dotted: str, keep: int = 3) -> tuple[str, ...]:
    parts = dotted.split(".")
    if len(parts) < 2 or not all(_NAME.fullmatch(p) for p in parts):
        return ()
    top = locate(parts[0])
    out, seen = [], 0
    for root in top.locations:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if _NAME.fullmatch(d))
            seen += len(files) + len(dirs)
            inner = os.path.relpath(folder, root).replace(os.sep, "/")
            prefix = parts[0] + ("" if inner == "." else "." + inner.replace("/", "."))
            if f"{parts[-1]}.py" in files or (parts[-1] in dirs and os.path.isfile(os.path.join(folder, parts[-1], "__init__.py"))):
                if (found := f"{prefix}.{parts[-1]}") != dotted:
                    out.append(found)
            if len(out) >= keep or seen > MAX_WALK:
                return tuple(out)
    return tuple(out)
