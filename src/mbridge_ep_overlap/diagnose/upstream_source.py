"""The checks in the installed Megatron-Core and Megatron-Bridge source, found by the message they raise.

Contract
--------
``checks()`` scans the ``.py`` files of the installed ``megatron/core`` and ``megatron/bridge`` once per
process (cached; located with ``importlib.util.find_spec``, so neither package is imported) and returns
every ``assert COND, MSG`` and every ``raise AssertionError|ValueError|RuntimeError|...(MSG)`` whose
message has literal text: its file (relative to the site directory, ``megatron/core/...``), line, the
condition (the ``assert`` expression, or the ``if`` above the raise, negated when the raise is in its
body), and the message as a pattern (the literal parts of an f-string, ``%``- or ``.format``-string kept,
every placeholder a wildcard). ``find(message)`` gives the check whose pattern matches the whole
message (the one with the most literal text first), else the nearest one by text similarity with
``exact=False``, else — no check raising it — the ``warnings.warn`` site that words it (kind ``WARNED``: the
installed version only warns where the run's raised), exactly or nearest, else None. For a traceback frame with no message to look up,
``function_checks(file, function)`` lists every ``assert`` / ``raise`` in that function (those without a
literal message too), ``defining_files(function)`` the installed files that define it, and
``installed_version(file)`` the distribution read. A file that cannot be read or parsed is skipped,
never raised.
"""

from __future__ import annotations

import ast
import difflib
import functools
import os
import importlib.util
from importlib import metadata
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("megatron.core", "megatron.bridge")
RAISED = {"AssertionError", "ValueError", "RuntimeError", "TypeError", "NotImplementedError", "KeyError"}
NEAREST_MIN_RATIO = 0.72
"""How alike (difflib ratio of the literal text) a reworded message must be to name a check at all."""
NEAREST_MAX_CHARS = 500
"""Characters of a message compared for likeness (a check's text is shorter)."""
LEADING_MIN = 16
"""Literal characters a message must share with the start of a check's text to be named by its start alone
(``leading_likeness``: twice this where the ends differ)."""
_MIN_LITERAL = 12
NO_LITERAL = "(no literal text)"
WARNED = "warning"
"""The kind of a ``warnings.warn`` site: what a raised message is matched with when no check raises it here."""
_PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfgexiu%]|\{[^{}]*\}")


@dataclass(frozen=True)
class Check:
    file: str
    """Relative to the site directory: ``megatron/core/transformer/transformer_config.py``."""
    line: int
    kind: str
    """The exception it raises (``AssertionError`` for an ``assert``)."""
    condition: str
    """What the check requires, as Python source."""
    literal: str
    """The message's literal text, placeholders as ``...``."""
    pattern: str
    function: str = ""
    """The function (or method) the check is in; '' at module level."""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def matches(self, message: str) -> bool:
        return _compiled(self.pattern).fullmatch(message.strip()) is not None


@dataclass(frozen=True)
class Match:
    check: Check
    exact: bool
    ratio: float


@functools.lru_cache(maxsize=None)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.DOTALL)


def roots() -> list[Path]:
    """The installed package folders of ``PACKAGES`` (those that are installed)."""
    found = []
    for name in PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for loc in (spec.submodule_search_locations or []) if spec else []:
            found.append(Path(loc))
    return found


@functools.lru_cache(maxsize=1)
def sources() -> tuple[tuple[str, str], ...]:
    """(relative path, text) of every ``.py`` file of the installed packages, read once."""
    out = []
    for root in roots():
        site = root.parents[1]
        for path in sorted(root.rglob("*.py")):
            try:
                out.append((path.relative_to(site).as_posix(), path.read_text(encoding="utf-8", errors="replace")))
            except OSError:
                continue
    return tuple(out)


@functools.lru_cache(maxsize=None)
def file_checks(rel: str) -> tuple[Check, ...]:
    """The checks of one file of ``sources()`` (parsed the first time a message points to it)."""
    tree = parsed(rel)
    return tuple(_file_checks(tree, rel)) if tree is not None else ()


@functools.lru_cache(maxsize=None)
def file_warnings(rel: str) -> tuple[Check, ...]:
    """The ``warnings.warn`` calls of one file of ``sources()`` with literal text, as checks of kind ``WARNED``."""
    tree = parsed(rel)
    return tuple(_file_checks(tree, rel, warned=True)) if tree is not None else ()


@functools.lru_cache(maxsize=None)
def parsed(rel: str) -> ast.AST | None:
    """The syntax tree of one file of ``sources()`` (parsed once, its warnings silenced), or None."""
    text = dict(sources()).get(rel)
    if text is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


@functools.lru_cache(maxsize=None)
def operands(check: Check) -> tuple[str, ...]:
    """How the installed code computes the names a check's condition tests, where it computes them from others: each
    ``NAME = EXPRESSION`` that last assigns a name of the condition above the check in its function, the expression
    not a plain name or constant (``expert_tensor_model_pipeline_parallel_size = expert_tensor_parallel_size *
    expert_model_parallel_size * ...``)."""
    tree = parsed(check.file)
    try:
        tested = {n.id for n in ast.walk(ast.parse(check.condition, mode="eval")) if isinstance(n, ast.Name)}
    except (SyntaxError, ValueError, RecursionError):
        return ()
    if tree is None or not tested:
        return ()
    scope = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.lineno <= check.line <= (n.end_lineno or n.lineno)
                  and not any(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m is not n
                              and m.lineno <= check.line <= (m.end_lineno or m.lineno) for m in ast.walk(n))), None)
    if scope is None:
        return ()
    last: dict[str, ast.Assign] = {}
    for node in ast.walk(scope):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in tested and node.lineno < check.line
                and (node.targets[0].id not in last or node.lineno > last[node.targets[0].id].lineno)):
            last[node.targets[0].id] = node
    return tuple(f"{name} = {' '.join(ast.unparse(a.value).split())}" for name, a in sorted(last.items())
                 if not isinstance(a.value, (ast.Name, ast.Constant)))


@functools.lru_cache(maxsize=None)
def function_checks(rel: str, function: str) -> tuple[Check, ...]:
    """Every ``assert`` and ``raise`` in the functions named ``function`` of one installed file, a
    message without literal text (or none) kept as '(no literal text)': a traceback's innermost frame
    names the function when the log holds no message to look up."""
    tree = parsed(rel)
    return tuple(c for c in _file_checks(tree, rel, keep_all=True) if c.function == function) if tree else ()


@functools.lru_cache(maxsize=None)
def defining_files(function: str) -> tuple[str, ...]:
    """The installed files that define a function or method of that name (``def function(``)."""
    pattern = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(function)}\s*\(", re.MULTILINE)
    return tuple(rel for rel, text in sources() if function in text and pattern.search(text))


def installed_version(rel: str) -> str:
    """'megatron-core 0.19.2' for a ``megatron/core/...`` path (the distribution holding the source read)."""
    name = "megatron-bridge" if rel.startswith("megatron/bridge/") else "megatron-core"
    try:
        return f"{name} {metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return f"{name} (version unknown)"


def checks() -> tuple[Check, ...]:
    """Every check of every file (parses them all: for tests and listings, not for one message)."""
    return tuple(c for rel, _ in sources() for c in file_checks(rel))


@functools.lru_cache(maxsize=256)
def find(message: str, raised_in: str = "", raised_line: int = 0) -> Match | None:
    """The check that raises ``message``; ``raised_in`` / ``raised_line`` (the traceback's innermost
    upstream frame, ``megatron/...`` relative) choose between checks that word it alike (MB repeats
    some of MCore's messages), the same file first, then the nearest line."""
    message = message.strip()
    if not message:
        return None
    files = _candidate_files(message)
    if raised_in and raised_in in dict(sources()) and raised_in not in files:
        files.append(raised_in)
    candidates = [c for rel in files for c in file_checks(rel)]

    def rank(c: Check) -> tuple:
        return (c.file == raised_in, -abs(c.line - raised_line) if c.file == raised_in else 0,
                len(c.literal.replace("...", "")))

    exact = [c for c in candidates if c.matches(message)]
    if exact:
        return Match(max(exact, key=rank), True, 1.0)
    near = message[:NEAREST_MAX_CHARS]  # likeness of a longer text costs quadratic time and says no more
    raised = _nearest(near, candidates, raised_in)
    if raised is not None:
        return raised
    # no check raises it here: a check the installed version relaxed to a warning (same text, or nearly)
    warned = [c for rel in files for c in file_warnings(rel)]
    exact = [c for c in warned if c.matches(message)]
    return Match(max(exact, key=rank), True, 1.0) if exact else _nearest(near, warned, raised_in)


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]+", text.lower()) if len(w) > 1}


def _candidate_files(message: str, keep: int = 20) -> list[str]:
    """The files that hold most of the message's words and word pairs, a rare one counting for more (a
    message's literal text is in its file; 'not' and 'with' are in every file, 'not supported' in fewer)."""
    seq = re.findall(r"[A-Za-z_][A-Za-z0-9_]+", message.lower())
    terms = set(_words(message)) | {f"{a} {b}" for a, b in zip(seq, seq[1:])}
    if not terms:
        return []
    texts = _lowered()
    weight: dict[str, float] = {}
    for term in terms:
        rels = [rel for rel, lower in texts if term in lower]
        for rel in rels:
            weight[rel] = weight.get(rel, 0.0) + (2.0 if " " in term else 1.0) / len(rels)
    return [rel for rel, _ in sorted(weight.items(), key=lambda t: (-t[1], t[0]))[:keep]]


@functools.lru_cache(maxsize=1)
def _lowered() -> tuple[tuple[str, str], ...]:
    return tuple((rel, text.lower()) for rel, text in sources())


def similarity(message: str, check: Check) -> float:
    """How alike a message and a check's literal text are: the better of the character ratio and the
    word overlap (a reworded message often keeps the words in another order)."""
    theirs, ours = _words(check.literal), _words(message)
    overlap = len(ours & theirs) / max(len(ours | theirs), 1)
    ratio = difflib.SequenceMatcher(None, message, check.literal.replace("...", "")).ratio()
    return max(ratio, overlap)


def leading_likeness(message: str, check: Check) -> float:
    """How alike a message is to a check that another version extended or reworded at its end: 1.0 where the
    message is the check's text cut after its first placeholder (``Invalid backend: None`` for
    ``f"Invalid backend: {x}" "Please set ..."``: the value one token, at least ``LEADING_MIN`` literal
    characters before it); where the two begin with the same ``LEADING_MIN``-plus characters of words,
    ``NEAREST_MIN_RATIO`` plus how much of the shorter text that start is; else 0."""
    literal = check.literal
    head = literal.split("...", 1)[0]
    message = message.strip()
    if "..." in literal and len(head) >= LEADING_MIN and message.startswith(head) \
            and re.fullmatch(r"\S+", message[len(head):]):
        return 1.0
    text = literal.replace("...", "")
    shared = len(os.path.commonprefix([message, text]))
    if shared < LEADING_MIN * 2 or "..." in text[:shared]:
        return 0.0
    return NEAREST_MIN_RATIO + (1 - NEAREST_MIN_RATIO) * shared / max(min(len(message), len(text)), 1) * 0.9


def _nearest(message: str, candidates: list[Check], raised_in: str = "") -> Match | None:
    best: Match | None = None
    for c in sorted(candidates, key=lambda c: c.file != raised_in):
        score = max(similarity(message, c), leading_likeness(message, c))
        if score >= NEAREST_MIN_RATIO and (best is None or score > best.ratio):
            best = Match(c, False, score)
    return best


# ---- reading one file -------------------------------------------------------------------------------

def _file_checks(tree: ast.AST, rel: str, keep_all: bool = False, warned: bool = False) -> list[Check]:
    """The checks of one parsed file; ``keep_all`` keeps those without a message or literal text too;
    ``warned``: the ``warnings.warn`` calls instead (kind ``WARNED``), their condition what avoids them."""
    found: list[Check] = []

    assigned: dict[str, ast.expr] = {}
    scope: list[str] = []
    elifs: dict[int, tuple[ast.expr, ...]] = {}
    """id of an ``elif``'s node -> the tests of the branches above it."""

    def add(line: int, kind: str, condition: str, msg: ast.expr | None) -> None:
        function = scope[-1] if scope else ""
        if msg is not None:
            _add(found, rel, line, kind, condition, _resolved(msg, assigned), function, keep_all)
        elif keep_all:
            found.append(Check(rel, line, kind, condition or "(unconditional)", NO_LITERAL, "", function))

    def visit(node: ast.AST, guard: tuple[ast.expr, bool] | None) -> None:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    assigned[target.id] = node.value
        if warned:
            if isinstance(node, ast.Call) and _is_warn(node.func) and node.args:
                cond = "" if guard is None else _negated(guard[0]) if guard[1] else ast.unparse(guard[0])
                add(node.lineno, WARNED, cond, node.args[0])
        elif isinstance(node, ast.Assert) and (node.msg is not None or keep_all):
            add(node.lineno, "AssertionError", ast.unparse(node.test), node.msg)
        elif isinstance(node, ast.Raise) and node.exc is not None:
            call = node.exc if isinstance(node.exc, ast.Call) else None
            func = call.func if call else node.exc
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if (name in RAISED or name.endswith("Error")) and (keep_all or (call and call.args)):
                cond = "" if guard is None else _negated(guard[0]) if guard[1] else ast.unparse(guard[0])
                add(node.lineno, name, cond, call.args[0] if call and call.args else None)
        if isinstance(node, ast.If):
            visit(node.test, guard)
            for child in node.body:
                visit(child, (node.test, True))
            chain = elifs.pop(id(node), ()) + (node.test,)
            if _is_elif(node):
                elifs[id(node.orelse[0])] = chain
                visit(node.orelse[0], guard)
                return
            # the ``else`` of an if / elif chain runs when none of the chain's tests held: it requires one
            either = chain[0] if len(chain) == 1 else ast.BoolOp(op=ast.Or(), values=list(chain))
            for child in node.orelse:
                visit(child, (either, False))
            return
        named = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if named:
            scope.append(node.name)
        for child in ast.iter_child_nodes(node):
            visit(child, None if named or isinstance(node, ast.ClassDef) else guard)
        if named:
            scope.pop()

    visit(tree, None)
    return found


def _is_warn(func: ast.expr) -> bool:
    """``warnings.warn(...)`` or a bare ``warn(...)``."""
    return (isinstance(func, ast.Attribute) and func.attr == "warn" and isinstance(func.value, ast.Name)
            and func.value.id == "warnings") or (isinstance(func, ast.Name) and func.id == "warn")


def _resolved(msg: ast.expr, assigned: dict[str, ast.expr]) -> ast.expr:
    """A message held in a variable: the value last assigned to it above (``msg = f"..."; raise X(msg)``)."""
    return assigned.get(msg.id, msg) if isinstance(msg, ast.Name) else msg


_FLIPPED = {ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn,
            ast.NotIn: ast.In, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt}


def _negated(test: ast.expr) -> str:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return ast.unparse(test.operand)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _FLIPPED:
        return ast.unparse(ast.Compare(test.left, [_FLIPPED[type(test.ops[0])]()], test.comparators))
    return f"not ({ast.unparse(test)})"


def _is_elif(node: ast.If) -> bool:
    return len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)


def _add(found: list[Check], rel: str, line: int, kind: str, condition: str, msg: ast.expr, function: str = "",
         keep_all: bool = False) -> None:
    parts = _parts(msg)
    literal = "".join("..." if p is None else p for p in parts or [])
    if parts is None or len(literal.replace("...", "").strip()) < _MIN_LITERAL:
        if keep_all:
            found.append(Check(rel, line, kind, condition or "(unconditional)",
                               literal.strip() if parts else NO_LITERAL, "", function))
        return
    pattern = "".join(".*?" if p is None else re.escape(p.strip() if i in (0, len(parts) - 1) else p)
                      for i, p in enumerate(parts))
    found.append(Check(rel, line, kind, condition or "(unconditional)", literal.strip(), pattern, function))


def _parts(node: ast.expr) -> list[str | None] | None:
    """The message as literal pieces and placeholders (None); None when it has no literal text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _split_placeholders(node.value)
    if isinstance(node, ast.JoinedStr):
        out: list[str | None] = []
        for v in node.values:
            out += [v.value] if isinstance(v, ast.Constant) and isinstance(v.value, str) else [None]
        return _merge(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _parts(node.left)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _parts(node.left), _parts(node.right)
        return _merge((left or [None]) + (right or [None])) if (left or right) else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"):
        return _parts(node.func.value)
    return None


def _split_placeholders(text: str) -> list[str | None]:
    out: list[str | None] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(text):
        if m.group() == "%%":
            continue
        out += [text[pos:m.start()], None]
        pos = m.end()
    out.append(text[pos:])
    return _merge(out)


def _merge(parts: list[str | None]) -> list[str | None]:
    out: list[str | None] = []
    for p in parts:
        if p == "":
            continue
        if p is None and out and out[-1] is None:
            continue
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
            continue
        out.append(p)
    return out
