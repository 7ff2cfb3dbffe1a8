"""A compile stopped by a header's ``#error`` directive (PyTorch's "C++20 or later compatible compiler is required",
CUDA's "unsupported GNU version", a missing feature macro), named from the headers installed here.

Contract
--------
``ErrorDirectives.feed(text, where)`` keeps each ``#error MSG`` a compiler printed (gcc / clang ``FILE:LINE:COL: error:
#error MSG``, nvcc / EDG ``FILE(LINE): error: #error directive: MSG``, or the words alone in a quoted report; colour
codes removed), at most ``MAX_ERRORS``, one per message, and every ``-std=c++NN`` / ``-std=gnu++NN`` the log's command
lines pass. ``findings(errors, standards)`` gives one ``error-directive:FILE`` finding per message from the
``ERROR_DIRECTIVE`` row (``signatures.build``): the header that holds it and the ``#if`` condition above it, from
``installed_headers.installed_directives()`` (the message word for word, else the nearest wording of the same header,
``NEAREST_RATIO`` alike: another release of that package, the installed release's text quoted). A message that asks for a
C++ standard (``C++NN or later``) names the standard the compile must use and the older ``-std`` flags the log shows
(the build hard-codes one; drop it and let the package's build helper choose, or pass the standard asked for). A
message in no installed header is named from its own words at ``UNKNOWN_CONFIDENCE``. Never raises for what is in the
lines.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass

from . import installed_headers
from .report import Finding
from .signatures.build import ERROR_DIRECTIVE

MAX_ERRORS = 6
NEAREST_RATIO = 0.8
KNOWN_CONFIDENCE = 0.7
UNKNOWN_CONFIDENCE = 0.4
_ANSI = re.compile(r"\x1b\[[0-9;]*[mK]")
LINE = re.compile(r"(?:(?P<file>[^\s\"():]+)(?::(?P<line>\d{1,9})(?::\d+)?:|\((?P<line2>\d{1,9})\):)\s*"
                  r"(?:fatal |catastrophic )?error:\s*)?#\s?error(?: directive:)?\s+(?P<message>\S.*?)\s*$")
STANDARD = re.compile(r"-std=(?:c|gnu)\+\+(\d\d)\b")
ASKS_STANDARD = re.compile(r"C\+\+\s?(\d\d) or later")


@dataclass
class DirectiveError:
    message: str
    file: str
    line: int
    where: str
    text: str


class ErrorDirectives:
    def __init__(self) -> None:
        self.errors: list[DirectiveError] = []
        self.standards: list[str] = []
        """The ``-std=`` values the log's command lines pass, in order seen, each once (``c++17``)."""

    def feed(self, text: str, where: str) -> None:
        if "-std=" in text:
            for m in re.finditer(r"-std=((?:c|gnu)\+\+\d\d)\b", text):
                if m.group(1) not in self.standards:
                    self.standards.append(m.group(1))
        if "error" not in text:
            return
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        m = LINE.search(text)
        if m is None or any(e.message == m["message"] for e in self.errors) or len(self.errors) >= MAX_ERRORS:
            return
        line = m["line"] or m["line2"]
        self.errors.append(DirectiveError(m["message"].strip('"').strip(), m["file"] or "", int(line) if line else 0,
                                          where, text.strip()[:300]))

    def finish(self) -> None:
        """Nothing is held across sources."""


def installed_match(message: str) -> tuple[installed_headers.SourceAssert | None, bool]:
    """The installed ``#error`` with this message (exact: True), else the nearest wording (False), else None."""
    wanted = installed_headers.normal(message).rstrip(".")
    best, ratio, words = None, 0.0, set(wanted.split())
    for d in installed_headers.installed_directives():
        text = installed_headers.normal(d.message).rstrip(".")
        if text == wanted:
            return d, True
        if abs(len(text) - len(wanted)) <= 12 and len(set(text.split()) & words) >= 0.6 * len(words):
            r = difflib.SequenceMatcher(None, text, wanted).ratio()
            if r > ratio:
                best, ratio = d, r
    return (best, False) if ratio >= NEAREST_RATIO else (None, False)


def findings(errors: list[DirectiveError], standards: list[str]) -> list[Finding]:
    out: dict[str, Finding] = {}
    for e in errors:
        found, exact = installed_match(e.message)
        header = found.rel if found else (e.file or "a header")
        detail = []
        if found is not None:
            detail.append(f"installed here: {found.rel}:{found.line}: #error {found.message}"
                          + (f" (under #if {found.condition})" if found.condition else ""))
            if not exact:
                detail.append("the run's header words it differently (another release of that package): the installed "
                              "release's text is quoted")
        cause = f"A header stopped the compile with #error: \"{e.message}\" ({header})."
        fix = f"meet what the header asks for: {e.message}"
        if (asked := ASKS_STANDARD.search(e.message)) is not None:
            need = asked.group(1)
            older = [s for s in standards if int(s[-2:]) < int(need)]
            cause = (f"The compile uses a C++ standard older than C++{need}, which {header} requires "
                     f"(\"{e.message}\")" + (f"; the log's commands pass {', '.join('-std=' + s for s in older)}" if older
                                            else "") + ": the build hard-codes an older standard than the installed "
                     "headers need.")
            fix = (f"compile with C++{need} or later: remove the hard-coded "
                   f"{' / '.join('-std=' + s for s in older) or '-std'} flag from the extension's build (let "
                   f"torch.utils.cpp_extension / CMake choose the standard the headers need) or pass -std=c++{need}")
        name = found.rel if found else (e.file.rsplit("/", 1)[-1] or re.sub(r"[^a-z0-9]+", "-", e.message.lower())[:40])
        sig = dataclasses.replace(ERROR_DIRECTIVE, id=f"{ERROR_DIRECTIVE.id}:{name.strip('-')}", cause=cause, fix=fix,
                                  confidence=KNOWN_CONFIDENCE if found is not None else UNKNOWN_CONFIDENCE)
        f = out.setdefault(sig.id, Finding(sig))
        f.add(f"{e.where}: {e.text}")
        f.detail += [d for d in detail if d not in f.detail]
    return list(out.values())
