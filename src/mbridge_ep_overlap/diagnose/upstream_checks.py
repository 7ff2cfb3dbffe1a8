"""Upstream config errors in general: an error raised by a Megatron-Core / Megatron-Bridge check, named
by finding its message in the installed source (``upstream_source``).

Contract
--------
``RaisedErrors.feed(text, where)`` is fed every line of a log; it keeps the ``AssertionError:`` /
``ValueError:`` / ``RuntimeError:`` lines (torchrun's ``[rankN]:`` prefix removed, and Ray's ``[repeated Nx across
cluster]`` suffix) with the traceback frames above them, and such an error printed as its repr inside another line
(``ValueError('MESSAGE')``: a wrapping exception's text, a Ray worker's log). An error is looked up when its frames are under ``megatron/core`` or
``megatron/bridge``, or when it has no frames at all; an error whose traceback runs only through other
packages (DeepEP, torch, a user script) is not. ``findings(errors)`` gives one ``Finding`` per check
named: a signature made from the ``upstream-check`` row (``signatures.config_error``) whose id is
``upstream-check:FILE:LINE``, cause "the check at FILE:LINE requires CONDITION", and the fix of the rule
of this library that mirrors that check (its ``upstream_match`` matches the message) when one does,
else the check itself. A message that is not in the installed source word for word (reworded, or from
another version) names the nearest check with a lower confidence and says so. A traceback with no
message (a bare exception, or a log cut after its frames; ``finish`` closes one; a traceback that ends in an
exception of another kind, an ``AttributeError`` raised on an ``assert`` line, is dropped), or whose message is
in no check, is named from its innermost ``raise`` / ``assert`` frame when that is in megatron/core or
megatron/bridge (``raise_frames``); an ``AssertionError`` whose innermost frame is an ``assert`` line of any
other package is named from that line (``raise_frames.named_assert``).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass, field

from . import raise_frames, upstream_source
from .report import Finding
from .signatures.config_error import UPSTREAM_CHECK

ERROR_LINE = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s*)*(?:[\w.]+\.)?(AssertionError|ValueError|RuntimeError|"
                        r"TypeError|NotImplementedError): (.{8,})$")
SHORT_FRAME = re.compile(r"^\s*(?P<file>[\w./-]+\.py):(?P<line>\d{1,7}) in (?P<function>\w+)\s*$")
"""A frame a report retypes short, under the error it belongs to."""
PAREN_ERROR = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s*)*(?:[\w.]+\.)?(AssertionError|ValueError|RuntimeError) "
                         r"\((?![\'\"])(.{8,400})\)$")
"""An exception quoted with its message in parentheses (``AssertionError (Communication call has not been issued ...)``),
as reports retype it."""
OTHER_ERROR = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s*)*(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Interrupt))(?::|$)")
"""An exception line that ends a traceback: one of a kind not read here (an ``AttributeError``) closes it unkept."""
REPR_ERROR = re.compile(r"(?<![\w.])(AssertionError|ValueError|RuntimeError|TypeError|NotImplementedError)"
                        r"\((?P<q>['\"])(?P<message>.{8,1000}?)(?P=q)\)")
"""An exception printed as its repr inside another line (a wrapping exception's message, a Ray worker's log):
``ValueError('MESSAGE')``."""
REPEATED = re.compile(r"\s*\[repeated \d{1,9}x across cluster\]\s*$")
"""Ray's suffix on a line its workers printed more than once."""
FRAME = re.compile(r'^(?:\[(?:rank|default)\d+\]:\s*)*\s*File "([^"]+)", line (\d{1,9}), in (\S+)')
PREFIX = re.compile(r"^(?:\[(?:rank|default)\d+\]:)+")
RAISE_LINE = re.compile(r"^(?:raise\s+(?:[\w.]+\.)?(\w+)\b|assert\b)")
UPSTREAM_FRAME = re.compile(r"megatron/(core|bridge)/")
DRIVES_MEGATRON = re.compile(r"megatron|mcore", re.IGNORECASE)
"""A frame of another package's Megatron backend (``slime/backends/megatron_utils``, ``mcore_adapter``)."""
EXACT_CONFIDENCE = 0.88
NEAREST_CONFIDENCE = 0.55
MAX_ERRORS = 8
SPECIFIC_PATTERN = 30
"""A rule's upstream message pattern this long names its check in either package."""


@dataclass
class RaisedError:
    kind: str
    message: str
    where: str
    frames: list[tuple[str, int, str]] = field(default_factory=list)
    """(file, line, function) of the traceback above it, outermost first."""
    code: list[str] = field(default_factory=list)
    """The source line Python printed under each frame ('' where none), as ``frames``."""
    after: list[tuple[str, int, str]] = field(default_factory=list)
    """Frames a report lists right after the error in short form (``FILE.py:LINE in FUNCTION``), innermost first."""

    @property
    def raise_frame(self) -> tuple[str, int, str, str] | None:
        """The innermost frame, with its source line, when it is a ``raise`` / ``assert`` line in
        megatron/core or megatron/bridge (the check itself, whatever the log says of its message)."""
        if not self.frames or not UPSTREAM_FRAME.search(self.frames[-1][0]):
            return None
        text = self.code[-1] if len(self.code) == len(self.frames) else ""
        return (*self.frames[-1], text) if RAISE_LINE.match(text) else None

    @property
    def assert_frame(self) -> tuple[str, int, str, str] | None:
        """The innermost frame, with its source line, when the error is an ``AssertionError`` raised by an
        ``assert`` line outside megatron/core and megatron/bridge (those are ``raise_frame``'s)."""
        if self.kind != "AssertionError" or not self.frames or UPSTREAM_FRAME.search(self.frames[-1][0]):
            return None
        text = self.code[-1] if len(self.code) == len(self.frames) else ""
        return (*self.frames[-1], text) if text.startswith("assert ") else None

    @property
    def upstream_frame(self) -> tuple[str, int, str] | None:
        return next((f for f in reversed(self.frames) if UPSTREAM_FRAME.search(f[0])), None)

    @property
    def looked_up(self) -> bool:
        return not self.frames or self.upstream_frame is not None


class RaisedErrors:
    """``feed`` every line, then ``finish`` at the end of each source: a traceback that ends without an
    error line with a message (a bare ``RuntimeError``, or a log cut after the frames) is kept, with an
    empty message, when its innermost frame is a ``raise`` / ``assert`` in megatron/core or megatron/bridge."""

    def __init__(self) -> None:
        self.errors: list[RaisedError] = []
        self._line = 0
        self._last_kept_line = -2
        self._frames: list[tuple[str, int, str]] = []
        self._code: list[str] = []
        self._where = ""

    def feed(self, text: str, where: str) -> None:
        self._line += 1
        if "across cluster]" in text:
            text = REPEATED.sub("", text)
        if "Traceback (most recent call last)" in text:
            self.finish()
        elif m := FRAME.match(text):
            self._frames.append((m.group(1), int(m.group(2)), m.group(3)))
            self._code.append("")
            self._where = where
        elif m := ERROR_LINE.match(text.strip()):
            self._keep(m.group(1), _unquoted(m.group(2).strip()), where)
        elif m := PAREN_ERROR.match(text.strip()):
            self._keep(m.group(1), m.group(2).strip(), where)
        elif (m := SHORT_FRAME.match(text)) and self.errors and not self._frames and len(self.errors[-1].after) < 4 \
                and self._last_kept_line == self._line - 1:
            self.errors[-1].after.append((m["file"], int(m["line"]), m["function"]))
            self._last_kept_line = self._line
        elif "Error(" in text and (m := REPR_ERROR.search(text)):
            message = m["message"].replace("\\" + m["q"], m["q"]).replace("\\n", " ").strip()
            self._keep(m.group(1), message, where)
        elif (m := OTHER_ERROR.match(text.strip())) and m.group(1) not in upstream_source.RAISED:
            self._frames, self._code = [], []  # that error is another reader's (its innermost line is no failed check)
        elif self._frames:
            code = PREFIX.sub("", text).strip()
            if code and not self._code[-1] and not set(code) <= set("^~ "):
                self._code[-1] = code

    def finish(self) -> None:
        """The traceback read so far ends here (a new one starts, or the source ends)."""
        if self._frames:
            kind = RAISE_LINE.match(self._code[-1])
            if kind and (UPSTREAM_FRAME.search(self._frames[-1][0]) or self._code[-1].startswith("assert ")):
                self._keep(kind.group(1) or "AssertionError", "", self._where)
        self._frames, self._code = [], []

    def _keep(self, kind: str, message: str, where: str) -> None:
        if len(self.errors) < MAX_ERRORS and all(e.message != message or not message for e in self.errors):
            self.errors.append(RaisedError(kind, message, where, self._frames, self._code))
            self._last_kept_line = self._line
        self._frames, self._code = [], []


def _unquoted(message: str) -> str:
    """The message without a quote left over at its end (a log line cut from a quoted string: ``... (16)"``)."""
    for q in "\"'":
        if message.endswith(q) and message.count(q) % 2 == 1:
            return message[:-1].rstrip()
    return message


def _short_hint(e: RaisedError) -> tuple[str, int]:
    """(installed file, line) of the innermost short-form frame listed under the error, when its file name is one
    installed file (Megatron-Core's first where both packages have one of that name), else ('', 0)."""
    if not e.after:
        return "", 0
    name, line, _ = e.after[0]
    base = name.rsplit("/", 1)[-1]
    rels = [rel for rel, _ in upstream_source.sources() if rel.endswith(name if "/" in name else "/" + base)]
    core = [r for r in rels if r.startswith("megatron/core/")]
    pick = core if len(core) == 1 else rels if len(rels) == 1 else []
    return (pick[0], line) if pick else ("", 0)


_LITERAL = re.compile(r"""(?<![\w{])(?P<q>["'])(?P<text>[^"'{}]{12,300})(?P=q)""")


def _code_literal(code: str) -> str:
    """The plain string literal of a ``raise`` / ``assert`` source line (no placeholders), or ''."""
    m = _LITERAL.search(code.split(",", 1)[1] if code.startswith("assert ") and "," in code else code)
    return m["text"] if m else ""


def _through_other_packages(e: RaisedError) -> upstream_source.Match | None:
    """An error whose visible traceback runs only through another package's Megatron backend (a training framework's
    ``megatron_utils`` calling Megatron-Core, the log cut above MCore's own frames): its check, when its message is a
    check's word for word and long enough (``SPECIFIC_PATTERN``) to be no other package's. A traceback through a
    package with no Megatron backend in its path (DeepEP's buffer) is not: its error is that package's own."""
    if e.looked_up or len(e.message) < SPECIFIC_PATTERN or not any(DRIVES_MEGATRON.search(f[0]) for f in e.frames):
        return None
    match = upstream_source.find(e.message)
    if match is None or not match.exact or match.check.kind == upstream_source.WARNED:
        return None
    words = len(match.check.literal.replace("...", "").strip())
    return match if words >= SPECIFIC_PATTERN else None  # '{} is not divisible by {}' would fit any such message


def findings(errors: list[RaisedError]) -> list[Finding]:
    out: dict[str, Finding] = {}
    for e in errors:
        frame = e.upstream_frame
        hint = (raise_frames.relative(frame[0]), frame[1]) if frame and "/megatron/" in frame[0] else _short_hint(e)
        match = upstream_source.find(e.message, *hint) if e.looked_up and e.message else None
        through = match is None and e.message and _through_other_packages(e)
        if through:
            match = through
        if (match is None or not match.exact) and e.raise_frame is not None:
            # the raising line the log shows holds the message literally: where the installed source has it
            own = _code_literal(e.raise_frame[3])
            at_code = upstream_source.find(own, *hint) if own else None
            if at_code is not None and at_code.exact:
                match = at_code
        if match:
            sig, detail = _signature(e, match), _detail(e, match)
            if through:
                detail.append(f"the traceback in the log runs through {e.frames[-1][0]} only (no megatron frame is "
                              f"shown), but the message is the installed check's word for word")
        elif e.raise_frame is not None:
            sig, detail = raise_frames.named(e)
        elif e.assert_frame is not None:
            sig, detail = raise_frames.named_assert(e)
        else:
            continue
        f = out.setdefault(sig.id, Finding(sig))
        frame = e.raise_frame or e.assert_frame
        f.add(f"{e.where}: {e.kind}: {e.message[:240]}" if e.message else
              f"{e.where}: {e.kind} raised at {raise_frames.relative(frame[0])}:{frame[1]} in {frame[2]} "
              f"(no message in the log)")
        f.detail += detail
    return list(out.values())


def _signature(e: RaisedError, match: upstream_source.Match):
    c = match.check
    rule = _mirroring_rule(e.message, c)
    versions = ("the installed version (the message is in its source word for word)" if match.exact else
                f"not the installed version: the message is not in its source word for word (reworded, or "
                f"from another version); nearest check, {match.ratio:.0%} alike")
    computed = upstream_source.operands(c)
    cause = f"The check at {c.where} requires {c.condition}" + (f", where {'; '.join(computed)}" if computed else "") + (
        "." if match.exact else " (the nearest check in the installed source: the run's version words it differently).")
    fix = rule.fix if rule else f"change the configuration so that {c.condition} holds (the check at {c.where})"
    if match.exact and (unknown := unknown_choice(e.message, c)) is not None:
        value, allowed, users = unknown
        version = upstream_source.installed_version(c.file)
        cause += (f" The run's value {value!r} is none of those the installed {version} accepts here "
                  f"({', '.join(map(repr, allowed))}): "
                  + (f"the installed {users[0][0]} names it ({users[0][1]}), so that code needs a newer release of "
                     f"the package whose check refuses it than {version}: the config comes from a release that "
                     "knows the value, the check from one that does not (a version skew)." if users else
                     "no installed Megatron package uses it, so it belongs to a release the run's config or recipe "
                     "was written for and this one is not (or it is a typo)."))
        fix = (f"use a value the installed {version} accepts ({', '.join(map(repr, allowed))}), or run the release "
               f"that knows {value!r} with the Megatron-Bridge / Megatron-Core it pairs with")
    if c.kind == upstream_source.WARNED:
        version = upstream_source.installed_version(c.file)
        cause = (f"The run's version raised {e.kind} here where the installed {version} only warns "
                 f"({c.where}, warnings.warn{'' if match.exact else ', worded a little differently'}): the check was "
                 f"relaxed between the two versions. It asks for {c.condition}.")
        fix = rule.fix if rule else (f"make {c.condition} hold (in the configuration the run passes), or run with "
                                     f"{version}, which warns instead of raising")
        versions = f"a version that raised it; {version} warns ({c.where})"
    return dataclasses.replace(
        UPSTREAM_CHECK, id=f"{UPSTREAM_CHECK.id}:{c.where}", cause=cause, fix=fix,
        source=f"installed:{c.where}", emitted=(c.literal,), versions=versions,
        confidence=EXACT_CONFIDENCE if match.exact else NEAREST_CONFIDENCE, rule=rule.id if rule else None)


def unknown_choice(message: str, check: upstream_source.Check) -> tuple[str, list[str], list[tuple[str, str]]] | None:
    """(the run's value, the string values the check accepts, [(package, where) of the other installed Megatron package's
    code that compares, assigns or maps the value])
    when the check is a choice among string literals (``X == 'a' or X == 'b'``, ``X in ('a', 'b')``, an if / elif
    chain's else) and its one placeholder in the message holds a value none of them is; None otherwise."""
    allowed, field = _string_choices(check.condition)
    prefix, sep, suffix = check.literal.partition("...")
    if not allowed or not sep or "..." in suffix or not field.isidentifier():
        return None
    text = message.strip()
    if not text.startswith(prefix) or not text.endswith(suffix) or len(text) <= len(prefix) + len(suffix):
        return None
    value = text[len(prefix):len(text) - len(suffix)].strip().strip("'\"")
    if not re.fullmatch(r"[\w.+-]{1,64}", value) or value in allowed:
        return None
    users = []
    own = "/".join(check.file.split("/")[:2])  # megatron/core or megatron/bridge
    # the same field compared with, assigned or passed the value on one line
    uses = re.compile(rf"\b{re.escape(field)}\b\s*(?:==|=|:)\s*[\"']{re.escape(value)}[\"']")
    for rel, source in upstream_source.sources():
        if rel.startswith(own) or value not in source:
            continue
        line = next((i for i, s in enumerate(source.splitlines(), 1) if uses.search(s)), None)
        if line is not None:
            users.append((upstream_source.installed_version(rel), f"{rel}:{line}"))
            break
    return value, allowed, users


def _string_choices(condition: str) -> tuple[list[str], str]:
    """(the string values an ``X == 'a' or X == 'b'`` / ``X in (...)`` condition accepts, X's last name); ([], '')
    for any other condition."""
    try:
        node = ast.parse(condition, mode="eval").body
    except SyntaxError:
        return [], ""
    parts = node.values if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) else [node]
    out, subject = [], None
    for p in parts:
        if not (isinstance(p, ast.Compare) and len(p.ops) == 1):
            return [], ""
        left, op, right = ast.unparse(p.left), p.ops[0], p.comparators[0]
        if subject not in (None, left):
            return [], ""
        subject = left
        if isinstance(op, ast.Eq) and isinstance(right, ast.Constant) and isinstance(right.value, str):
            out.append(right.value)
        elif isinstance(op, ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)) and all(
                isinstance(x, ast.Constant) and isinstance(x.value, str) for x in right.elts):
            out += [x.value for x in right.elts]
        else:
            return [], ""
    return (out, subject.rsplit(".", 1)[-1]) if out else ([], "")


def _detail(e: RaisedError, match: upstream_source.Match) -> list[str]:
    c = match.check
    out = [f"upstream check: {c.where} ({c.kind}): requires {c.condition}",
           f"upstream message: {c.literal}"] + [f"computed in the installed source as: {x}" for x in upstream_source.operands(c)]
    if c.kind == upstream_source.WARNED:
        out[0] = f"upstream warning: {c.where} (warnings.warn): avoided when {c.condition}"
    if (frame := e.upstream_frame) is not None:
        raised_at = f"{frame[0]}:{frame[1]} in {frame[2]}"
        out.append(f"raised at {raised_at} in the run" + ("" if frame[0].endswith(c.file) and frame[1] == c.line
                                                          else f"; installed source has the check at {c.where}"))
    if not match.exact and c.kind != upstream_source.WARNED:
        out.append("the message is not in the installed version's source: it was reworded, or comes from "
                   "another version; the check named is the nearest one")
    return out


def _mirroring_rule(message: str, check: upstream_source.Check):
    """The rule of this library that mirrors the check: its upstream message pattern matches the message
    (or the check's text), and a short pattern ('is supported for') only for a check in the package its
    upstream check lives in (MCore and MB repeat some checks, so a long pattern counts in either); the
    longest such pattern when several do."""
    from ..core.rules import RULES  # function-level: loads the rule table only when a check is named

    package = "/".join(check.file.split("/")[:2])
    fitting = []
    for rule in RULES:
        where = rule.upstream.source
        longest = max((len(part) for part in rule.upstream_match.split("|")), default=0)
        if longest < 12 or not where or (longest < SPECIFIC_PATTERN and not where[0].startswith(package)):
            continue
        pattern = re.compile(rule.upstream_match)
        if pattern.search(message) or pattern.search(check.literal):
            fitting.append(rule)
    return max(fitting, key=lambda r: len(r.upstream_match), default=None)
