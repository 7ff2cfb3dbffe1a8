"""A ``static_assert`` that failed when a kernel was compiled, read from what nvcc, gcc and clang print.

Contract
--------
``StaticAsserts.feed(text, where)`` is fed every line of a log (``finish()`` after each source); it keeps each failed
``static_assert`` (``FailedAssert``, at most ``MAX_ASSERTS``, one per file:line and message) from the formats in
``ERROR_LINES``:

- nvcc, NVRTC and nvc++ (the EDG front end): ``FILE(LINE): error: static assertion failed with "MSG"`` (nothing after
  ``failed`` without a message; ``error #N-D:`` with error numbers on) and ``"FILE", line LINE: error: ...``;
- gcc / g++: ``FILE:LINE:COL: error: static assertion failed: MSG`` (C's ``_Static_assert``: MSG in quotes; nothing
  after ``failed`` without a message), and its note ``the comparison reduces to ‘(...)’``;
- clang 16 and newer: ``static assertion failed due to requirement 'COND': MSG`` / ``static assertion failed: MSG``;
  clang 15 and older: ``static_assert failed due to requirement 'COND' "MSG"`` / ``static_assert failed "MSG"`` (also
  wrapped onto the line after ``error:``);

anywhere in a line (a JIT compiler's ``NVCC compilation failed: `` before it, colour codes removed). The source line the
compilers print under it (``static_assert(COND, "MSG");`` / ``EP_STATIC_ASSERT(...)``, over several lines too, gcc's
``  3 | `` gutter removed) gives the condition; such a statement with no error line before it (a pasted excerpt) is kept
as ``pasted``. nvcc's ``[with NAME=VALUE, ...]`` after the error gives the run's template parameters. Where it was
compiled is read from the same source's other lines: a compile at run time from the JIT compilers' own lines
(HybridEP's ``Failed to compile the code, compile command:``, DeepEP V2's ``NVCC compilation failed:``, a
``.deepep/hybrid_ep/jit`` path, NVRTC's ``default_program``, torch's ``Error building extension``), a build from a
build tool's (``error: command '...nvcc' failed``, ``ninja: build stopped``, CMake, make, pip).

``findings(asserts)`` gives one finding per assert, from the ``static-assert`` row
(``signatures.compile_checks.STATIC_ASSERT``), id ``static-assert:LIBRARY:FILE:LINE``. The message (else the condition)
is looked up in ``STATIC_ASSERTS`` (the file's name and the nearest line choosing among rows of one message): the
library, where its kernel is compiled (``JIT``), file:line, the condition, the run's values of its parameters and the
condition evaluated with them, what sets each parameter (``FEEDS``, with the installed Megatron-Core lines behind it),
and the row's cause and fix in the user's terms where it has them; at ``KNOWN_CONFIDENCE``. Not there: the C/C++
headers installed here (``installed_headers``), at ``INSTALLED_CONFIDENCE``; else a generic finding naming the
message, condition and file, at ``UNKNOWN_CONFIDENCE``. A pasted statement alone is named ``PASTED_DISCOUNT`` lower.
Never raises for what is in the lines.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
import re
from dataclasses import dataclass, field

from . import installed_headers, installed_modules, upstream_source
from .report import Finding
from .signatures.compile_checks import FEEDS, JIT, STATIC_ASSERT, STATIC_ASSERTS, KnownAssert

KNOWN_CONFIDENCE = 0.75
INSTALLED_CONFIDENCE = 0.6
UNKNOWN_CONFIDENCE = 0.35
PASTED_DISCOUNT = 0.15
MAX_ASSERTS = 8
CONTEXT_LINES = 6
"""Lines after an error line that may hold its source line."""
BINDING_LINES = 80
"""Lines after an error line that may hold nvcc's ``[with ...]`` (a long instantiation chain)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[mK]")
_FILE = r"(?<![^\s\"'(=])(?P<file>[^\s\"():]+)"
# nvcc's wording is the EDG front end's, as a real nvcc log shows it ('FILE(LINE): error: static assertion failed with
# "MSG"', the source line and '^' under it, then 'detected during: instantiation of ... [with NAME=VALUE, ...]'): the
# ik_llama.cpp report (github.com/ikawrakow/ik_llama.cpp/issues/412) and DeepEP's corpus report deepep-50
# (github.com/deepseek-ai/DeepEP/issues/50); nvc++'s '"FILE", line N: error:' form: github.com/NVIDIA/cutlass/issues/1031.
# clang's two wordings (16 and newer; 15 and older) are its own tests' (llvm/llvm-project and an older copy in
# carbon-language/carbon-lang, clang/test/SemaCXX/static-assert.cpp); gcc's are what the installed gcc prints. The tests
# make the installed gcc, and nvcc where there is one, print theirs.
ERROR_LINES: tuple[tuple[str, re.Pattern], ...] = (
    ("nvcc", re.compile(_FILE + r"\((?P<line>\d{1,9})\): error(?: #\d+(?:-D)?)?: static assertion failed"
                        r"(?: with \"(?P<message>.*)\")?\s*$")),
    ("nvc++", re.compile(r"\"(?P<file>[^\"]+)\", line (?P<line>\d{1,9}): error(?: #\d+(?:-D)?)?: static assertion failed"
                         r"(?: with \"(?P<message>.*)\")?\s*$")),
    ("clang", re.compile(r"(?:" + _FILE + r":(?P<line>\d{1,9}):(?:\d+:)? )?error: (?:static assertion failed due to "
                         r"requirement '(?P<evaluated>.*)'(?:: (?P<message>.*))?|static_assert failed due to requirement "
                         r"'(?P<evaluated2>.*?)'(?: \"(?P<message2>.*)\")?)\s*$")),
    ("clang", re.compile(r"(?:" + _FILE + r":(?P<line>\d{1,9}):(?:\d+:)? )?error: static_assert failed"
                         r"(?: \"(?P<message>.*)\")?\s*$")),
    ("gcc", re.compile(_FILE + r":(?P<line>\d{1,9}):(?:\d+:)? error: static assertion failed(?:: (?P<message>.*))?\s*$")),
    ("gcc", re.compile(r"(?:^|\s)error: static assertion failed(?:: (?P<message>.*))?\s*$")),  # a line without FILE:LINE
    ("reported", re.compile(r"^\s*(?P<file>[^\s\"():]+\.(?:cuh|cu|h|hpp|cpp|cc|cxx)): static assertion failed"
                            r"(?::\s*(?P<message>.+?))?:?\s*$")),
)
"""(compiler, the expression of its error line), most specific first. ``reported``: a header's name alone before the
words, as a report or a JIT wrapper shortens the compiler's line (``hybrid_ep_backend.cuh: static assertion failed:``,
the message on the next line)."""
_QUOTED = re.compile(r'^\s*"(?P<message>[^"]{8,400})"\s*$')
"""A line that is a quoted message alone: the message of an error line printed without one just above it."""
_ASSIGNED = re.compile(r"^\s*[A-Z_][A-Z0-9_]*\s*=\s*-?\d+\b")
"""A line that starts ``NAME=VALUE`` (a parameter and its value written under the error, as nvcc's ``[with ...]``)."""
_WRAPPED = re.compile(r"^\s*(static assertion failed|static_assert failed)\b")
_GUTTER = re.compile(r"^\s*\d*\s*\|\s?")
_WITH = re.compile(r"\[with (?P<bindings>.*)\]")
_REDUCES = re.compile(r"note: the comparison reduces to [‘'`](?P<evaluated>.+)[’']\s*$")
_VALUE = re.compile(r"^(?:-?\d+)[uUlL]*$|^(?:true|false)$")
JIT_MARKS = (
    (re.compile(r"Failed to compile the code, compile command: "), "HybridEP's JIT: its nvcc run failed"),
    (re.compile(r"\.deepep/hybrid_ep/jit/"), "HybridEP's JIT: a source in its JIT folder"),
    (re.compile(r"NVCC (?:PTX )?compilation failed: |Running NVCC (?:PTX )?command: "), "DeepEP V2's JIT: its nvcc run failed"),
    (re.compile(r"(?<![\w/])default_program\(\d+\)"), "NVRTC"),
    (re.compile(r"Error building extension '|Building extension module "), "torch.utils.cpp_extension's JIT build, load"),
)
BUILD_MARKS = re.compile(r"error: command '[^']*' failed with exit (?:code|status)|ninja: build stopped|"
                         r"subprocess\.CalledProcessError: Command '\['ninja'|Building wheels? for|Failed to build |"
                         r"running build_ext|building '[^']+' extension|CMake Error|make(?:\[\d+\])?: \*\*\*|"
                         r"error: subprocess-exited-with-error|Getting requirements to build wheel")


@dataclass
class FailedAssert:
    file: str
    line: int
    message: str
    where: str
    text: str
    compiler: str
    condition: str = ""
    evaluated: str = ""
    """The condition with the run's values, as the compiler printed it (clang's requirement, gcc's note)."""
    bindings: dict[str, str] = field(default_factory=dict)
    """The run's template parameters (nvcc's ``[with ...]``)."""
    pasted: bool = False
    """A source statement with no error line before it."""
    compiled: str = ""
    """'' (not said), 'build', or how it was compiled at run time."""


class StaticAsserts:
    def __init__(self) -> None:
        self.asserts: list[FailedAssert] = []
        self._start = 0
        self._pending: FailedAssert | None = None
        self._since = 0
        self._previous = ""
        self._statement = ""
        self._opened = ("", "")
        """(where, line) of the statement being read."""
        self._jit = ""
        self._build = False

    def feed(self, text: str, where: str) -> None:
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        previous, self._previous = self._previous, text
        self._since += 1
        if self._jit != JIT_MARKS[0][1] and ("/jit/" in text or "ompil" in text or "default_program" in text
                                              or "xtension" in text):
            seen = next((words for mark, words in JIT_MARKS if mark.search(text)), "")
            ranked = [words for _, words in JIT_MARKS]
            if seen and (not self._jit or ranked.index(seen) < ranked.index(self._jit)):
                self._jit = seen  # the JIT's own error line over a path that only names its folder
        if not self._build and ("uild" in text or "rror" in text or "ailed" in text or "***" in text):
            self._build = bool(BUILD_MARKS.search(text))
        if "static" in text and "failed" in text:
            error = _error(text) or (_error(previous.rstrip() + " " + text.strip()) if _WRAPPED.match(text)
                                     and previous.rstrip().endswith("error:") else None)
            if error is not None:
                self._keep(dataclasses.replace(error, where=where))
                return
        pending = self._pending if self._pending is not None and self._since <= BINDING_LINES else None
        if self._statement or ("static_assert" in text or "STATIC_ASSERT" in text) and installed_headers.START.search(text):
            self._source(text, where, pending)
        elif pending is not None:
            if (m := _WITH.search(text)) is not None:
                for name, value in _bindings(m.group("bindings")):
                    pending.bindings.setdefault(name, value)
            elif (m := _REDUCES.search(text)) is not None and not pending.evaluated:
                pending.evaluated = m.group("evaluated").strip()
            elif not pending.message and self._since <= CONTEXT_LINES and (m := _QUOTED.match(text)) is not None:
                pending.message = m.group("message").strip()
            elif _ASSIGNED.match(text):
                for name, value in _bindings(re.split(r"\s{2,}|\(", text.strip())[0]):
                    pending.bindings.setdefault(name, value)

    def _source(self, text: str, where: str, pending: FailedAssert | None) -> None:
        code = _GUTTER.sub("", text) if _GUTTER.match(text) else text
        if not self._statement:
            m = installed_headers.START.search(code)
            if m is None or code.lstrip().startswith(("//", "#")):
                return
            self._statement, self._opened = code[m.end():], (where, text.strip()[:300])
        else:
            self._statement += " " + code.strip()
        parsed = installed_headers.split_call(self._statement)
        if parsed is None:
            if len(self._statement) > 2000 or self._statement.count(" ") > 400:
                self._statement = ""
            return
        self._statement = ""
        condition, message = parsed
        if pending is not None and self._since <= CONTEXT_LINES and not pending.condition \
                and (not pending.message or not message or _same(pending.message, message)):
            pending.condition = condition
            pending.message = pending.message or message
        elif condition or message:
            self._keep(FailedAssert("", 0, message, *self._opened, "", condition, pasted=True))

    def _keep(self, a: FailedAssert) -> None:
        a.message = a.message.strip()
        if a.compiler == "gcc" and len(a.message) >= 2 and a.message[0] == a.message[-1] == '"':
            a.message = a.message[1:-1]  # C's _Static_assert: gcc quotes the message
        same = next((o for o in self.asserts if (o.file.rsplit("/", 1)[-1], o.line) == (a.file.rsplit("/", 1)[-1], a.line)
                     and _same(o.message, a.message) and (o.condition == a.condition or not a.pasted)), None)
        if same is not None:
            self._pending, self._since = (same, 0) if not a.pasted else (self._pending, self._since)
            return
        if a.pasted and any(_same(o.message, a.message) and (o.condition in ("", a.condition)) for o in self.asserts):
            return  # the source line of an error already kept
        if len(self.asserts) >= MAX_ASSERTS:
            return
        self.asserts.append(a)
        if not a.pasted:
            self._pending, self._since = a, 0

    def finish(self) -> None:
        """The source read so far ends: where its asserts were compiled is what its lines said."""
        said = self._jit or ("build" if self._build else "")
        for a in self.asserts[self._start:]:
            a.compiled = a.compiled or said
        self._start = len(self.asserts)
        self._pending, self._statement, self._jit, self._build, self._previous = None, "", "", False, ""


def _error(text: str) -> FailedAssert | None:
    for compiler, pattern in ERROR_LINES:
        if (m := pattern.search(text)) is not None:
            g = m.groupdict()
            line = g.get("line")
            return FailedAssert(g.get("file") or "", int(line) if line else 0,
                                g.get("message") or g.get("message2") or "", "", text.strip()[:300], compiler,
                                evaluated=(g.get("evaluated") or g.get("evaluated2") or "").strip())
    return None


def _same(a: str, b: str) -> bool:
    """One message, whatever its spacing and a final full stop (a report's copy often drops it)."""
    return installed_headers.normal(a).rstrip(".") == installed_headers.normal(b).rstrip(".")


def _bindings(text: str) -> list[tuple[str, str]]:
    """NAME=VALUE pairs of nvcc's ``[with ...]`` whose value is a number or a bool (commas inside <> and () kept)."""
    out, depth, cur = [], 0, ""
    for c in text[:4000] + ",":
        if c in "<([":
            depth += 1
        elif c in ">)]":
            depth = max(depth - 1, 0)
        if c == "," and depth == 0:
            name, _, value = cur.strip().partition("=")
            if re.fullmatch(r"[A-Za-z_]\w*", name.strip()) and _VALUE.match(value.strip()):
                out.append((name.strip(), value.strip().rstrip("uUlL")))
            cur = ""
        else:
            cur += c
    return out


# ---- the findings -----------------------------------------------------------------------------------------

def findings(asserts: list[FailedAssert]) -> list[Finding]:
    out: dict[str, Finding] = {}
    for a in asserts:
        try:
            sig, detail = _named(a)
        except (RecursionError, ValueError, OSError):  # an odd source or value: that assert unnamed
            continue
        if a.pasted:
            detail.insert(0, "the log holds the statement alone (no compiler error line): taken as the one that failed")
        f = out.setdefault(sig.id, Finding(sig))
        f.add(f"{a.where}: {a.text}")
        f.detail += [d for d in detail if d not in f.detail]
    return list(out.values())


def known(a: FailedAssert) -> tuple[KnownAssert | None, list[KnownAssert]]:
    """The table's row of the assert (its message, else its condition; the file's name and the nearest line choose),
    and the other rows of that message."""
    if a.message:
        rows = [r for r in STATIC_ASSERTS if _same(r.message, a.message)]
    elif a.condition:
        rows = [r for r in STATIC_ASSERTS if r.condition.replace(" ", "") == a.condition.replace(" ", "")]
    else:
        rows = []
    if not rows:
        return None, []
    base = a.file.replace("\\", "/").rsplit("/", 1)[-1]
    squeezed = a.condition.replace(" ", "")

    def rank(r: KnownAssert) -> tuple:
        return (r.path.rsplit("/", 1)[-1] != base if base else False,
                bool(squeezed) and r.condition.replace(" ", "") != squeezed, abs(r.line - a.line) if a.line else 0)

    rows.sort(key=rank)
    return rows[0], rows[1:]


def _named(a: FailedAssert):
    row, others = known(a)
    if row is not None:
        return _known(a, row, others)
    rel = installed_modules.site_relative(a.file) if a.file else ""
    found = installed_headers.find(a.message, a.condition, rel)
    if found:
        return _installed(a, found[0])
    return _unknown(a)


def _slug(library: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", library.lower()).strip("-") or "native-code"


def _sure(a: FailedAssert, confidence: float) -> float:
    return round(confidence - PASTED_DISCOUNT, 2) if a.pasted else confidence


def _quoted(condition: str, message: str) -> str:
    return (f"{condition} " if condition else "its condition (not in the log) ") + (f'("{message}")' if message else
                                                                                   "(no message)")


def _compiled_words(a: FailedAssert, library: str = "") -> str:
    if a.compiled and a.compiled != "build":
        return f"at run time ({a.compiled})"
    if library in JIT and a.compiled != "build":
        return f"at run time ({library}'s JIT)"
    return "in a build" if a.compiled == "build" else "when it was compiled (the log does not say whether in a build)"


def _known(a: FailedAssert, row: KnownAssert, others: list[KnownAssert]):
    condition = a.condition or row.condition
    values = _values(a, condition)
    compiled = _compiled_words(a, row.library)
    cause = (f"{row.library}'s kernel failed to compile {compiled}: the static_assert at {row.where} requires "
             f"{_quoted(condition, row.message)}{values}")
    feeds = _feeds(row.library, condition)
    cause += f"; {row.cause}" if row.cause else (
        "; " + "; ".join(f"{names} comes from {f.python}" + (f" (Megatron-Core: {f.mcore})" if f.mcore else "")
                         for names, f in feeds) if feeds else "")
    fix = row.fix or (f"give {row.library} values that meet {condition}: " + "; ".join(
        f"{names}: {f.python}" + (f" (Megatron-Core: {f.mcore})" if f.mcore else "") for names, f in feeds)
        if feeds else f"give {row.library} values that meet {condition}, or use a {row.library} release whose kernel "
                      "accepts the run's")
    detail = [f"static_assert at {row.at}:{row.where}: {condition}, \"{row.message}\""]
    if row.jit:
        detail.append(f"compiled at run time by {row.jit}")
    if a.file:
        detail.append(f"the log's file: {a.file}" + (f":{a.line}" if a.line else " (no line given)") + (
            f" (the quoted release has it at line {row.line}: another version)" if a.line and a.line != row.line
            and a.file.endswith(row.path.rsplit("/", 1)[-1]) else ""))
    if others:
        detail.append("the same message at: " + ", ".join(o.where for o in others[:4]))
    detail += _binding_words(a, condition)
    for names, f in feeds:
        detail.append(f"{names}: {f.python}" + (f"; Megatron-Core: {f.mcore}" if f.mcore else ""))
        detail += _installed_lines(f.looks)
    sig = dataclasses.replace(STATIC_ASSERT, id=f"{STATIC_ASSERT.id}:{_slug(row.library)}:{row.where}", cause=cause + ".",
                              fix=fix, confidence=_sure(a, KNOWN_CONFIDENCE), source=f"{row.at}:{row.where}",
                              versions=f"{row.library} at {row.at.split('@')[1][:12]}")
    return _with_url(sig, row), detail


def _with_url(sig, row: KnownAssert):
    repo, commit = row.at.split("@")
    return dataclasses.replace(sig, source=f"https://github.com/{repo}/blob/{commit}/{row.path}#L{row.line}")


def _installed(a: FailedAssert, found: installed_headers.SourceAssert):
    dist = installed_modules.distribution_of(found.rel)
    version = f"{dist} {installed_modules.version_of(dist)}" if dist else found.rel.split("/", 1)[0]
    condition = a.condition or found.condition
    where = f"{found.rel}:{found.line}"
    cause = (f"a kernel or extension failed to compile {_compiled_words(a)} on a static_assert of {version}'s "
             f"headers: {where} requires {_quoted(condition, found.message)}{_values(a, condition)}")
    fix = (f"the static_assert at {where} requires {condition}: give it what it requires, or build with the {version} "
           "release the code being compiled supports")
    detail = [f"installed here: {where} ({version}): {found.condition}, \"{found.message}\""]
    if a.file:
        detail.append(f"the log's file: {a.file}" + (f":{a.line}" if a.line else " (no line given)"))
    detail += _binding_words(a, condition)
    sig = dataclasses.replace(STATIC_ASSERT, id=f"{STATIC_ASSERT.id}:{_slug(dist or version)}:{where}", cause=cause + ".",
                              fix=fix, confidence=_sure(a, INSTALLED_CONFIDENCE), source=f"installed:{found.rel}",
                              versions=f"the installed {version}")
    return sig, detail


def _library(path: str) -> str:
    p = path.replace("\\", "/").lower()
    for part, name in (("hybrid_ep", "HybridEP"), ("deep_ep", "DeepEP"), ("deepep", "DeepEP"),
                       ("transformer_engine", "Transformer Engine"), ("transformerengine", "Transformer Engine")):
        if part in p:
            return name
    rel = installed_modules.site_relative(path)
    return rel.split("/", 1)[0] if rel else ""


def _unknown(a: FailedAssert):
    library = _library(a.file) if a.file else ""
    where = f"{a.file}:{a.line}" if a.file else "a file the log does not name"
    of = f" of {library}" if library else ""
    cause = (f"a static_assert in a compiled extension{of} failed {_compiled_words(a, library)}: {where} requires "
             f"{_quoted(a.condition, a.message)}{_values(a, a.condition)}; it is none of the known static_asserts of "
             "DeepEP, HybridEP and Transformer Engine, nor in the C/C++ headers installed here")
    fix = (f"read the static_assert at {where}: give the kernel the values its condition needs, or build with the "
           "toolkit, headers and flags the release of that code supports")
    detail = _binding_words(a, a.condition)
    short = (a.file.replace("\\", "/").rsplit("/", 1)[-1] if a.file else re.sub(r"\W+", "-", a.message[:40]).strip("-")
             or "source")
    sig = dataclasses.replace(STATIC_ASSERT, id=f"{STATIC_ASSERT.id}:{_slug(library)}:{short}:{a.line}", cause=cause + ".",
                              fix=fix, confidence=_sure(a, UNKNOWN_CONFIDENCE),
                              versions="the log's own text (not found in a known source)")
    return sig, detail


def _names(condition: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r"\b[A-Za-z_]\w*\b", condition)))


def _feeds(library: str, condition: str) -> list[tuple[str, object]]:
    names = set(_names(condition))
    return [(", ".join(n for n in f.names if n in names), f) for f in FEEDS.get(library, ()) if names & set(f.names)]


def _binding_words(a: FailedAssert, condition: str) -> list[str]:
    used = {n: a.bindings[n] for n in _names(condition) if n in a.bindings}
    out = []
    if used:
        out.append("the run's template parameters (from the compiler): " + ", ".join(f"{k}={v}" for k, v in used.items()))
    if a.evaluated:
        out.append(f"with the run's values the compiler reads it as {a.evaluated}")
    return out


def _values(a: FailedAssert, condition: str) -> str:
    """'; with the run's values, A % B == 0 is 4112 % 64 == 0: 16 == 0, false' (or the compiler's reading)."""
    used = {n: a.bindings[n] for n in _names(condition) if n in a.bindings}
    if used and (told := evaluate(condition, used)):
        return f"; with the run's values ({', '.join(f'{k}={v}' for k, v in used.items())}) it reads {told}"
    if a.evaluated:
        return f"; with the run's values it reads {a.evaluated}"
    return ""


def _quotient(x: int, y: int) -> int:
    """C's integer division: truncated toward zero."""
    q = abs(x) // abs(y)
    return q if (x >= 0) == (y >= 0) else -q


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Mod: lambda x, y: x - y * _quotient(x, y), ast.FloorDiv: _quotient}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
        ast.GtE: operator.ge}


def evaluate(condition: str, values: dict[str, str]) -> str:
    """The condition with ``values`` put in and worked out ('4112 % 64 == 0: 16 == 0, false'), or '' where it holds
    anything but integers, + - * / % and comparisons (``sizeof``, a type, a call)."""
    text = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: {"true": "1", "false": "0"}.get(values.get(m.group(0), m.group(0)),
                                                                                   values.get(m.group(0), m.group(0))),
                  condition)
    if not re.fullmatch(r"[\d\s+\-*/%()<>=!]+", text) or len(text) > 300:
        return ""
    try:
        tree = ast.parse(text.replace("/", "//"), mode="eval").body
        if isinstance(tree, ast.Compare) and len(tree.ops) == 1:
            left, right = _int(tree.left), _int(tree.comparators[0])
            holds = _CMP[type(tree.ops[0])](left, right)
            op = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}[type(tree.ops[0])]
            return f"{' '.join(text.split())}: {left} {op} {right}, {'true' if holds else 'false'}"
    except (SyntaxError, KeyError, ZeroDivisionError, TypeError, ValueError, RecursionError, OverflowError):
        return ""
    return ""


def _int(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_int(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _int(node.left), _int(node.right)
        if abs(left) > 10 ** 18 or abs(right) > 10 ** 18:
            raise OverflowError
        return _OPS[type(node.op)](left, right)
    raise ValueError


def _installed_lines(looks: tuple[str, ...]) -> list[str]:
    """The installed Megatron-Core lines that feed a parameter: 'the installed megatron-core 0.19.2 at FILE:LINE: `...`'."""
    out = []
    for look in looks:
        pattern = re.compile(look, re.MULTILINE)
        for rel, source in upstream_source.sources():
            if (m := pattern.search(source)) is None:
                continue
            line = source.count("\n", 0, m.start()) + 1
            text = " ".join(source.splitlines()[line - 1].split())
            out.append(f"the installed {upstream_source.installed_version(rel)} at {rel}:{line}: `{text}`")
            break
    return out
