"""A function of a package installed here, found from a traceback's frames and read from its source: its signature,
and whether the call a ``TypeError`` describes fits it.

Contract
--------
``Call.parse(message)``: the function a ``TypeError`` message names and what it says of the call (an unexpected or
repeated keyword, positional arguments taken and given, required arguments missing, a function taking none), or None
for a message that names no function (``object of type 'bool' has no len()``). ``module_of(path)``: the dotted module an
installed file is (below its site directory, and found by ``installed_modules.locate``), or ''. ``imports(dotted)``:
local name -> dotted target of that module's imports (relative ones resolved). ``find(call, modules)``: the first def of
the function (a method of the class the message names, or the ``__init__`` of a class of that name) in the installed
modules given, or in the module one of them imports it from (``MAX_HOPS``), as ``Found`` (the module, its file below the
site directory, the line, the signature as written, the distribution and its version). ``fits(found, call)``: what the
installed signature says of the call: whether it takes the keyword, how many positional arguments it takes, which of
the missing ones it requires. ``calls_in(dotted, function, callee)``: the calls of ``callee`` (by its own name) in the
installed def(s) of ``function`` in that module, each with the keywords it passes and those it binds in a
``functools.partial`` argument. Nothing is imported; a source that cannot be read is skipped; never raises.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from . import foreign_attributes, installed_modules

MAX_HOPS = 3
_FUNCTION = r"(?P<function>[A-Za-z_][\w.]*|<lambda>)\(\)"
FORMS = (
    ("keyword", re.compile(_FUNCTION + r" got an unexpected keyword argument '(?P<keyword>\w+)'")),
    ("repeated", re.compile(_FUNCTION + r" got multiple values for (?:keyword )?argument '(?P<keyword>\w+)'")),
    ("count", re.compile(_FUNCTION + r" takes (?P<takes>\d+|from \d+ to \d+) positional arguments? but (?P<given>\d+)"
                         r"(?: positional arguments?)? (?:was|were) given")),
    ("missing", re.compile(_FUNCTION + r" missing (?P<n>\d+) required (?P<which>positional|keyword-only) arguments?: "
                           r"(?P<names>.+?)\s*$")),
    ("none", re.compile(_FUNCTION + r" takes no (?:keyword )?arguments(?: \((?P<given>\d+) given\))?")),
)


@dataclass(frozen=True)
class Call:
    kind: str
    """"keyword", "repeated", "count", "missing" or "none" (``FORMS``)."""
    function: str
    """As the message names it: ``dispatch``, ``Widget.__init__``, ``pkg.is_enabled``."""
    keyword: str = ""
    takes: str = ""
    given: int = 0
    missing: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The function's own name (a class's name for ``Class.__init__``)."""
        parts = self.function.split(".")
        return parts[-2] if parts[-1] == "__init__" and len(parts) >= 2 else parts[-1]

    @property
    def owner(self) -> str:
        """The class of a method (``Widget`` for ``Widget.run``), else ''."""
        parts = self.function.split(".")
        return parts[-2] if len(parts) >= 2 and parts[-1] != "__init__" and parts[-2][:1].isupper() else ""

    @staticmethod
    def parse(message: str) -> Call | None:
        for kind, pattern in FORMS:
            if (m := pattern.search(message)) is not None:
                g = m.groupdict()
                missing = tuple(re.findall(r"'(\w+)'", g.get("names") or ""))
                return Call(kind, g["function"], g.get("keyword") or "", g.get("takes") or "",
                            int(g["given"]) if g.get("given") else 0, missing)
        return None


@dataclass(frozen=True)
class Found:
    module: str
    rel: str
    line: int
    signature: str
    """``name(a, b, *, c=...)`` as the source writes it."""
    args: ast.arguments
    method: bool
    """A method (its first parameter is the instance or class, which Python counts)."""
    distribution: str

    @property
    def where(self) -> str:
        return f"{self.rel}:{self.line}"

    @property
    def version(self) -> str:
        return f"{self.distribution} {installed_modules.version_of(self.distribution)}" if self.distribution else \
            self.module.split(".")[0]


def module_of(path: str) -> str:
    rel = installed_modules.site_relative(path)
    if not rel.endswith(".py"):
        return ""
    dotted = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return dotted if installed_modules.locate(dotted).kind == "source" else ""


def _tree(dotted: str) -> tuple[ast.Module | None, installed_modules.Located]:
    loc = installed_modules.locate(dotted)
    return installed_modules.tree(loc), loc


def imports(dotted: str) -> dict[str, str]:
    tree, loc = _tree(dotted)
    out: dict[str, str] = {}
    if tree is None:
        return out
    package = dotted if loc.path is not None and loc.path.name == "__init__.py" else dotted.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                keep = len(parts) - node.level + 1
                if keep < 1:  # climbs above the top package: nothing it names is known
                    continue
                base = ".".join(parts[:keep] + ([base] if base else []))
            for a in node.names:
                out[a.asname or a.name] = f"{base}.{a.name}"
    return out


def _defs(tree: ast.Module, call: Call) -> list[tuple[ast.AST, bool]]:
    """(the def, whether it is a method) of the function in one module's tree."""
    out = []
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    if call.function.endswith("__init__") or call.name[:1].isupper():
        for c in classes:
            if c.name == call.name:
                out += [(n, True) for n in c.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and n.name == "__init__"]
    if call.owner:
        for c in classes:
            if c.name == call.owner:
                out += [(n, True) for n in c.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and n.name == call.name]
    if not out:
        for fn, outer in foreign_attributes._functions(tree, call.name):
            out.append((fn, bool(outer) and isinstance(outer[-1], ast.ClassDef)))
    return out


def find(call: Call, modules: list[str]) -> Found | None:
    todo, seen = [(m, 0) for m in modules if m], set()
    while todo:
        dotted, hops = todo.pop(0)
        if dotted in seen or len(seen) > 40:
            continue
        seen.add(dotted)
        tree, loc = _tree(dotted)
        if tree is None:
            continue
        defs = _defs(tree, call)
        if defs:
            fn, method = defs[0]
            return Found(dotted, loc.rel, fn.lineno, f"{fn.name}({ast.unparse(fn.args)})", fn.args, method,
                         installed_modules.distribution_of(loc.rel))
        if hops < MAX_HOPS:
            target = imports(dotted).get(call.name)
            if target:
                todo.append((target.rpartition(".")[0], hops + 1))
    return None


def fits(found: Found, call: Call) -> tuple[bool | None, str]:
    """(whether the installed signature accepts the call as the message describes it (None: cannot tell), the words)."""
    a = found.args
    positional = [p.arg for p in a.posonlyargs + a.args]
    names = positional + [p.arg for p in a.kwonlyargs]
    at = f"the installed {found.version}'s {found.signature} ({found.where})"
    if call.kind == "repeated":  # the keyword is a parameter by the error itself: the call passed it twice
        return None, (f"{at}: a value for {call.keyword} was passed both by position and by name (the installed "
                      f"signature's order: {', '.join(positional) or 'none'})")
    if call.kind == "keyword":
        if call.keyword in names:
            return True, f"{at} takes {call.keyword}: the run's copy is another version than the one installed here"
        if a.kwarg is not None:
            return None, f"{at} takes **{a.kwarg.arg}: whether it accepts {call.keyword} is not known from its signature"
        return False, f"{at} has no parameter {call.keyword} either: the calling code was written for another version"
    if call.kind == "count":
        counted = len(positional)
        if a.vararg is not None:
            return True, f"{at} takes *{a.vararg.arg}: any number of positional arguments (the run's copy differs)"
        accepted = counted >= call.given
        return accepted, (f"{at} takes {counted} positional argument{'s' if counted != 1 else ''}"
                          + (" (the instance counted)" if found.method else "")
                          + (f": {call.given} fit it, so the run's copy is another version than the one installed here"
                             if accepted else f": {call.given} do not fit it either: the calling code was written for "
                             "another version"))
    if call.kind == "missing":
        defaults = len(a.defaults)
        required = set(positional[:len(positional) - defaults] if defaults else positional) | \
            {p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None}
        needed = [m for m in call.missing if m in required]
        if needed:
            return False, f"{at} requires {', '.join(needed)} too: the calling code was written for another version"
        return True, f"{at} does not require {', '.join(call.missing)}: the run's copy is another version"
    if call.kind == "none":  # "takes no arguments": the installed one accepts some when it has any beyond the instance
        takes = [n for n in names if not (found.method and n in ("self", "cls"))]
        accepts = bool(takes) or a.vararg is not None or a.kwarg is not None
        return accepts, (f"{at} takes arguments: the run's copy is another version than the one installed here" if accepts
                         else f"{at} takes none either: the calling code was written for another version")
    return None, at


@dataclass(frozen=True)
class CallSite:
    rel: str
    line: int
    code: str
    """The call's first source line, stripped."""
    keywords: tuple[str, ...]
    """The keywords it passes by name."""
    bound: tuple[str, ...] = ()
    """The keywords bound in a ``functools.partial(...)`` among its arguments (passed to that function instead)."""


def calls_in(dotted: str, function: str, callee: str) -> list[CallSite]:
    tree, loc = _tree(dotted)
    if tree is None:
        return []
    lines = (loc.path.read_text(errors="replace").splitlines() if loc.path else [])
    out = []
    for fn, _ in foreign_attributes._functions(tree, function):
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and _name(node.func) == callee:
                bound = [k.arg for a in node.args if isinstance(a, ast.Call) and _name(a.func) == "partial"
                         for k in a.keywords if k.arg]
                code = lines[node.lineno - 1].strip() if 0 < node.lineno <= len(lines) else ast.unparse(node)[:200]
                out.append(CallSite(loc.rel, node.lineno, code, tuple(k.arg for k in node.keywords if k.arg), tuple(bound)))
    return out


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
