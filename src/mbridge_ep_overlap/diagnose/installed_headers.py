"""The ``static_assert`` lines of the C/C++ sources installed here (torch's headers, NVIDIA wheels' headers, Megatron's).

Contract
--------
``source_asserts(text)`` parses the ``static_assert(COND, "MSG")`` / ``EP_STATIC_ASSERT(...)`` / ``_Static_assert``
statements of one C/C++ text (a statement may span lines; ``//`` comments and ``#define`` lines are skipped) into
``SourceAssert`` rows: line, condition (whitespace collapsed), message (its string literals joined, '' without one).
``split_call(text)`` reads one such call's arguments from the text after its ``(`` (None while its ``)`` is not there).
``installed()`` walks the site directories of this Python (``sysconfig``'s purelib / platlib and the folders the
installed Megatron is in) once per process, bounded by ``MAX_FILES`` and ``MAX_BYTES``, and keeps every such row of a
file whose name ends in a C/C++ suffix, with its path below the site directory. ``find(message, condition, rel)`` gives
the installed rows with that message (or, without one, that condition), those of the file ``rel`` names first.
``error_directives(text)`` / ``installed_directives()``: the same for ``#error`` lines (the ``#if`` above as the
condition). Nothing
is imported or compiled; a file that cannot be read is skipped; never raises.
"""

from __future__ import annotations

import functools
import os
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from . import upstream_source

SUFFIXES = (".h", ".hpp", ".hh", ".cuh", ".cu", ".cpp", ".cc", ".cxx", ".c", ".inl")
MAX_FILES = 60000
MAX_BYTES = 400 * 2 ** 20
START = re.compile(r"(?<![\w.])(EP_STATIC_ASSERT|static_assert|_Static_assert)\s*\(")
_STRING = re.compile(r'(?:u8|[uUL])?"((?:[^"\\\n]|\\.)*)"')
MAX_SPAN = 8
"""Lines one statement may span."""


@dataclass(frozen=True)
class SourceAssert:
    line: int
    condition: str
    message: str
    rel: str = ""
    """The file below its site directory (``torch/include/c10/util/Foo.h``); '' for a text not installed."""


def split_call(text: str) -> tuple[str, str] | None:
    """(condition, message) of the arguments in ``text`` (what follows the call's ``(``), or None when they do not close."""
    depth, quoted, i, comma = 1, False, 0, -1
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                break
        elif c == "," and depth == 1:
            comma = i
        i += 1
    else:
        return None
    args = text[:i]
    if comma >= 0 and _STRING.search(args[comma + 1:]):
        condition, message = args[:comma], "".join(_STRING.findall(args[comma + 1:]))
    else:
        condition, message = args, ""
    return " ".join(condition.split()), _unescaped(message)


def _unescaped(message: str) -> str:
    return re.sub(r"\\([\"\\'])", r"\1", message).replace("\\n", " ").strip()


def source_asserts(text: str, rel: str = "") -> list[SourceAssert]:
    out = []
    rows = text.splitlines()
    for i, row in enumerate(rows):
        m = START.search(row)
        if m is None or row.lstrip().startswith(("//", "#")) or "//" in row[:m.start()]:
            continue
        joined = row[m.end():]
        parsed = split_call(joined)
        for extra in rows[i + 1:i + MAX_SPAN]:
            if parsed is not None:
                break
            joined += " " + extra.strip()
            parsed = split_call(joined)
        if parsed is not None:
            out.append(SourceAssert(i + 1, parsed[0], parsed[1], rel))
    return out


def _sites() -> list[Path]:
    found: list[Path] = []
    for key in ("purelib", "platlib"):
        try:
            found.append(Path(sysconfig.get_paths()[key]))
        except (KeyError, OSError):
            continue
    found += [r.parents[1] for r in upstream_source.roots() if len(r.parents) > 1]
    return list(dict.fromkeys(p for p in found if p.is_dir()))


_DIRECTIVE = re.compile(r"^\s*#\s*error\b\s*(?P<message>.*?)\s*$")
_CONDITIONAL = re.compile(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b\s*(?P<condition>.*?)\s*$")


def error_directives(text: str, rel: str = "") -> list[SourceAssert]:
    """The ``#error`` lines of one C/C++ text: line, the ``#if`` / ``#elif`` condition nearest above it, its message
    (quotes removed)."""
    out, condition = [], ""
    for i, row in enumerate(text.splitlines()):
        if (c := _CONDITIONAL.match(row)) is not None:
            condition = " ".join(c["condition"].split())
        elif (m := _DIRECTIVE.match(row)) is not None:
            out.append(SourceAssert(i + 1, condition, m["message"].strip('"').strip(), rel))
    return out


@functools.lru_cache(maxsize=1)
def installed() -> tuple[SourceAssert, ...]:
    return _scan()[0]


@functools.lru_cache(maxsize=1)
def installed_directives() -> tuple[SourceAssert, ...]:
    """The ``#error`` directives of the C/C++ files installed here (the same walk as ``installed``)."""
    return _scan()[1]


@functools.lru_cache(maxsize=1)
def _scan() -> tuple[tuple[SourceAssert, ...], tuple[SourceAssert, ...]]:
    out: list[SourceAssert] = []
    directives: list[SourceAssert] = []
    files = size = 0
    for site in _sites():
        for folder, dirs, names in os.walk(site):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            for name in sorted(names):
                if not name.endswith(SUFFIXES):
                    continue
                files += 1
                path = Path(folder) / name
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                size += len(data)
                if files > MAX_FILES or size > MAX_BYTES:
                    return tuple(out), tuple(directives)
                if b"static_assert" in data or b"STATIC_ASSERT" in data:
                    out += source_asserts(data.decode("utf-8", errors="replace"), path.relative_to(site).as_posix())
                if b"#error" in data or b"# error" in data:
                    directives += error_directives(data.decode("utf-8", errors="replace"), path.relative_to(site).as_posix())
    return tuple(out), tuple(directives)


def normal(text: str) -> str:
    return " ".join(text.split())


def find(message: str, condition: str = "", rel: str = "") -> list[SourceAssert]:
    message, squeezed = normal(message), condition.replace(" ", "")
    if not message and not squeezed:
        return []
    if message:
        rows = [r for r in installed() if normal(r.message) == message]
    else:
        rows = [r for r in installed() if r.condition.replace(" ", "") == squeezed]
    base = rel.rsplit("/", 1)[-1]
    return sorted(rows, key=lambda r: (r.rel != rel, r.rel.rsplit("/", 1)[-1] != base, r.rel, r.line))
