"""The frames of the Python traceback a log is printing, and the findings of one exception kind's reader.

Contract
--------
``Frames`` holds the frames of the traceback being read, as (file, line, function, the line printed under it),
outermost first. ``Frames.start_or_frame(text)``: a ``Traceback (most recent call last)`` line starts over; a
``File "F", line N, in FN`` line (torchrun's ``[rankN]:`` prefixes allowed, ``upstream_checks.FRAME``) adds that frame,
at most ``MAX_FRAMES`` kept (the innermost), unless ``skip(file)`` says the file is machinery (the frame and its printed
line are then left out); True when the line was one of these. ``Frames.other(text)`` for any other line the reader
did not take: a line that ends the traceback in another exception (``other_end``, when given) drops the frames; else
the first non-blank line after a frame that is no caret marker is that frame's printed line. ``take()`` returns the
frames and starts over.

``named_findings(errors, name)``: one ``Finding`` per signature id that ``name(error)`` returns ``(signature,
detail)`` for (None: the error is not named); an error whose source is too deep or odd to read (``RecursionError``,
``ValueError``, ``SyntaxError``, ``OSError`` while naming it) is left unnamed. Each error adds the evidence line
``WHERE: LINE`` (its ``where`` and ``line``), its details each once. Never raises for the text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from .report import Finding
from .upstream_checks import FRAME, PREFIX

MAX_FRAMES = 64
Frame = tuple[str, int, str, str]


class Frames:
    def __init__(self, skip: Callable[[str], bool] | None = None, other_end: re.Pattern | None = None) -> None:
        self.frames: list[Frame] = []
        self._skip = skip
        self._other_end = other_end
        self._skipping = False

    def __bool__(self) -> bool:
        return bool(self.frames)

    def start_or_frame(self, text: str) -> bool:
        if "Traceback (most recent call last)" in text:
            self.frames = []
            return True
        if m := FRAME.match(text):
            self._skipping = bool(self._skip and self._skip(m.group(1)))
            if not self._skipping:
                self.frames.append((m.group(1), int(m.group(2)), m.group(3), ""))
                del self.frames[:-MAX_FRAMES]
            return True
        return False

    def other(self, text: str) -> None:
        if not self.frames:
            return
        code = PREFIX.sub("", text).strip()
        if self._other_end is not None and self._other_end.match(code):
            self.frames = []  # a traceback that ended in another exception: its frames are no longer this reader's
        elif not self.frames[-1][3] and not self._skipping and code and not set(code) <= set("^~ "):
            self.frames[-1] = (*self.frames[-1][:3], code[:200])

    def take(self) -> list[Frame]:
        frames, self.frames = self.frames, []
        return frames


def named_findings(errors: Iterable[Any], name: Callable[[Any], tuple | None]) -> list[Finding]:
    out: dict[str, Finding] = {}
    for e in errors:
        try:
            named = name(e)
        except (RecursionError, ValueError, SyntaxError, OSError):  # a source too deep or odd to read: that error unnamed
            named = None
        if named is None:
            continue
        sig, detail = named
        f = out.setdefault(sig.id, Finding(sig))
        f.add(f"{e.where}: {e.line}")
        f.detail += [d for d in detail if d not in f.detail]
    return list(out.values())
