"""What one method of an installed Megatron class does to ``self``, in source order, and under which tests.

The attributes it reads and sets, and the methods it calls on ``self`` / ``super()`` / a base class, each with the
tests that must hold for it to run.

Contract
--------
``events(cls, method)`` (a ``class_source.ClassInfo``; cached) gives ``Event`` s sorted by where they happen: a
"read" / "store" of ``self.NAME`` (``self.x += 1`` reads; an assignment stores once its value is computed;
``setattr(self, "x", v)`` stores), a "self" / "super" / "class" call of method NAME (``self.m(...)``,
``super().m(...)``, ``Base.m(self, ...)``), and a "set-on-every-path" store after an ``if`` / ``try`` all of whose
branches set NAME (or leave the method). ``guards`` are the tests, as source text, that must hold for the event to
run: the ``if`` / ``elif`` / ``else`` around it (``not (TEST)`` for an ``else`` and for the branches above an
``elif``), an ``if TEST: return / raise`` above it (``not (TEST)``) or an ``assert TEST``, the operands before it of
an ``and`` / ``or``, and the test of a conditional expression; ``conditions`` leaves out those a ``raise`` /
``assert`` adds (past the call, the caller runs only where they held). ``register_parameter`` / ``register_buffer`` /
``add_module`` of a name store it. Code of nested functions, lambdas and classes is not the method's (it
runs later). Never raises for what is in the source.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass

from .class_source import ClassInfo, methods, text


@dataclass(frozen=True)
class Event:
    pos: tuple[int, int]
    kind: str
    """"read", "store", "set-on-every-path" (``name`` the attribute) or "self" / "super" / "class" (a call of method
    ``name``)."""
    name: str
    line: int
    text: str
    """The call as the source writes it, or ``self.NAME``."""
    guards: tuple[str, ...]
    base: str = ""
    """For a "class" call: the class as written (``MegatronModule`` in ``MegatronModule.__init__(self)``)."""
    conditions: tuple[str, ...] = ()
    """``guards`` less those an ``if not TEST: raise`` / ``assert TEST`` above adds: a caller goes on past the call
    only where they hold, so they are no condition of what the event does for the code after the call."""


_ENDS = (ast.Return, ast.Raise)
_EXIT = "\0"
"""Marks a guard that a ``raise`` / ``assert`` above adds (``Event.conditions`` leaves it out)."""
_REGISTERS = {"register_parameter", "register_buffer", "add_module", "register_module"}
"""``nn.Module`` methods that set the attribute their first argument names."""


@functools.lru_cache(maxsize=None)
def events(cls: ClassInfo, method: str) -> tuple[Event, ...]:
    fn = methods(cls).get(method)
    if fn is None or not fn.args.args:
        return ()
    return tuple(sorted(_Walk(fn.args.args[0].arg, text(cls.file)).block(fn.body, ()), key=lambda e: e.pos))


@functools.lru_cache(maxsize=64)
def _lines(source: str) -> tuple[bytes, ...]:
    """A file's lines as UTF-8 bytes (the AST's column offsets count bytes), split once per file."""
    return tuple(line.encode("utf-8") for line in source.splitlines(keepends=True))


def _segment(lines: tuple[bytes, ...], node: ast.AST) -> str | None:
    """``ast.get_source_segment`` without re-splitting the file at each call."""
    try:
        first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined]
        c0, c1 = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
    except AttributeError:
        return None
    if first < 0 or last >= len(lines) or c1 is None:
        return None
    if first == last:
        return lines[first][c0:c1].decode("utf-8", errors="replace")
    parts = [lines[first][c0:]] + list(lines[first + 1:last]) + [lines[last][:c1]]
    return b"".join(parts).decode("utf-8", errors="replace")


class _Walk:
    def __init__(self, me: str, source: str) -> None:
        self.me, self.source, self.out = me, source, []
        self.lines = _lines(source)

    def seg(self, node: ast.AST) -> str:
        """The source text of a node on one line (a bracket's inner spaces of a wrapped line dropped)."""
        flat = " ".join((_segment(self.lines, node) or ast.unparse(node)).split())
        return re.sub(r"([(\[{]) | ([)\]}])", r"\1\2", flat)

    def negated(self, test: ast.expr) -> str:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.seg(test.operand)
        return f"not ({self.seg(test)})"

    def block(self, stmts: list[ast.stmt], guards: tuple[str, ...]) -> list[Event]:
        for stmt in stmts:
            self.visit(stmt, guards)
            if isinstance(stmt, _ENDS):
                break
            if isinstance(stmt, ast.Assert):
                guards += (_EXIT + self.seg(stmt.test),)
            if isinstance(stmt, ast.If):
                body_ends, else_ends = _ends(stmt.body), _ends(stmt.orelse)
                if body_ends and else_ends:
                    break
                mark = _EXIT if isinstance((stmt.body if body_ends else stmt.orelse or [None])[-1], ast.Raise) else ""
                guards += (mark + self.negated(stmt.test),) if body_ends else (mark + self.seg(stmt.test),) \
                    if else_ends else ()
            if isinstance(stmt, (ast.If, ast.Try)):
                end = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
                self.out += [_event(end, "set-on-every-path", n, stmt.lineno, f"self.{n}", guards)
                             for n in sorted(_definite([stmt], self.me)[0])]
        return self.out

    def visit(self, node: ast.AST, guards: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return  # defined here, runs later
        if isinstance(node, ast.If):
            self.visit(node.test, guards)
            self.block(node.body, guards + (self.seg(node.test),))
            self.block(node.orelse, guards + (self.negated(node.test),))
            return
        if isinstance(node, ast.IfExp):
            self.visit(node.test, guards)
            self.visit(node.body, guards + (self.seg(node.test),))
            self.visit(node.orelse, guards + (self.negated(node.test),))
            return
        if isinstance(node, ast.BoolOp):
            before: tuple[str, ...] = ()
            for value in node.values:
                self.visit(value, guards + before)
                before += (self.seg(value),) if isinstance(node.op, ast.And) else (self.negated(value),)
            return
        if isinstance(node, ast.AugAssign) and _is_self(node.target, self.me):  # ``self.x += 1`` reads it first
            self.visit(node.value, guards)
            self.add(node.target, "read", node.target.attr, f"self.{node.target.attr}", guards)
            return
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            self.visit(node.value, guards)  # the value first, then the store, at the statement's end
            end = (node.end_lineno or node.lineno, node.end_col_offset or 0)
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for t in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                    if _is_self(t, self.me):
                        self.out.append(_event(end, "store", t.attr, t.lineno, f"self.{t.attr}", guards))
                    else:
                        self.visit(t, guards)
            return
        if _is_self(node, self.me):
            store = isinstance(node.ctx, ast.Store)
            self.add(node, "store" if store else "read", node.attr, f"self.{node.attr}", guards, end=store)
        if isinstance(node, ast.Call):
            self.call(node, guards)
        for _, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                self.block(value, guards)
            elif isinstance(value, list):
                for child in value:
                    if isinstance(child, ast.AST):
                        self.visit(child, guards)
            elif isinstance(value, ast.AST):
                self.visit(value, guards)

    def add(self, node: ast.AST, kind: str, name: str, shown: str, guards, base: str = "", end: bool = False) -> None:
        pos = (node.end_lineno or node.lineno, node.end_col_offset or 0) if end else (node.lineno, node.col_offset)
        self.out.append(_event(pos, kind, name, node.lineno, shown, guards, base))

    def call(self, node: ast.Call, guards: tuple[str, ...]) -> None:
        func, me = node.func, self.me
        shown = self.seg(node)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) >= 2 and _is_name(node.args[0], me) \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            self.add(node, "store", node.args[1].value, shown, guards, end=True)
        if not isinstance(func, ast.Attribute):
            return
        value = func.value
        if _is_name(value, me) and func.attr in _REGISTERS and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            self.add(node, "store", node.args[0].value, shown, guards, end=True)
        if _is_name(value, me):
            self.add(node, "self", func.attr, shown, guards)
        elif isinstance(value, ast.Call) and _is_name(value.func, "super"):
            self.add(node, "super", func.attr, shown, guards)
        elif isinstance(value, (ast.Name, ast.Attribute)) and node.args and _is_name(node.args[0], me):
            self.add(node, "class", func.attr, shown, guards, base=ast.unparse(value))


def _event(pos, kind: str, name: str, line: int, shown: str, guards: tuple[str, ...], base: str = "") -> Event:
    return Event(pos, kind, name, line, shown, tuple(g.removeprefix(_EXIT) for g in guards), base,
                 tuple(g for g in guards if not g.startswith(_EXIT)))


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_self(node: ast.AST, me: str) -> bool:
    return isinstance(node, ast.Attribute) and _is_name(node.value, me)


def _ends(stmts: list[ast.stmt]) -> bool:
    return bool(stmts) and isinstance(stmts[-1], _ENDS)


def _definite(stmts: list[ast.stmt], me: str) -> tuple[set[str], bool]:
    """(the attributes of ``me`` that running ``stmts`` sets on every path, whether every path leaves the method)."""
    names: set[str] = set()
    for s in stmts:
        if isinstance(s, (ast.Assign, ast.AnnAssign)):
            for t in s.targets if isinstance(s, ast.Assign) else [s.target]:
                names |= {e.attr for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]) if _is_self(e, me)}
        elif isinstance(s, ast.If):
            (a, a_ends), (b, b_ends) = _definite(s.body, me), _definite(s.orelse, me)
            if a_ends and b_ends:
                return names, True
            names |= b if a_ends else a if b_ends else a & b
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            a, ends = _definite(s.body, me)
            names |= a
            if ends:
                return names, True
        elif isinstance(s, ast.Try):
            a, _ = _definite(s.body, me)
            handled = [_definite(h.body, me) for h in s.handlers]
            if all(ends for _, ends in handled):
                names |= a
            names |= _definite(s.finalbody, me)[0]
        elif isinstance(s, _ENDS):
            return names, True
    return names, False
