"""What a run left behind, opened as a user points at it: files, folders, ``-`` (stdin).

Contract
--------
``collect(paths, stdin)`` sorts every file under the paths into the evidence kinds ``base.run_files``
names (facts, watchdog events, faulthandler logs, flight-recorder dumps) and plain text logs (anything
else that is not binary: MB logs, Slurm output, torchrun per-rank ``attempt_N/R/std{out,err}.log``), a
gzip-compressed one (file or paste) read through its decompression (a log compressed twice, as a
gzipped Slurm output gzipped again by an upload, through both; at most ``MAX_GZIP_LAYERS``).
``lines(source)`` streams a text source as (file:line, rank, text) with the torchrun / srun prefix
taken off and terminal colour and cursor codes (ANSI escape sequences: a coloured console, ``rich``
tracebacks) removed from text and raw alike; of a line longer than ``MAX_LINE`` bytes the first and the last ``MAX_LINE`` are kept, the
middle is skipped, never held. ``Held`` / ``join``: how a reader keeps back a line whose message a log or a paste
wrapped onto the next one, and reads the two as one (each reader decides which lines it holds and which go on).
Refused (``UsageError``, exit 2): a path that does not exist or cannot be read, and paths that hold no
readable evidence at all (empty files, only binary files, empty folders).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

from ..base import run_files
from ..base.errors import UsageError

MAX_LINE = 8192
MAX_GZIP_LAYERS = 3
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
"""An ANSI escape sequence: CSI (colours, cursor moves: ``ESC [ 1;31 m``), OSC (a window title or a hyperlink,
ended by BEL or ``ESC \\``) or a two-byte one."""
_GZIP_MAGIC = b"\x1f\x8b"
_PROBE = 8192
_PREFIX = re.compile(r"^(?:\[(?:default|rank)(\d+)\]:\s?|\s*(\d+): (?:\[(?:default|rank)\d+\]:\s?)?)")
"""torchrun's ``[rankN]:`` / ``[defaultN]:``, srun's ``--label`` ``N: `` (padded to the width of the largest task
number), or both (srun around torchrun: `` 187: [rank187]: ...``)."""
_RANK_DIR = re.compile(r"(?:^|/)attempt_\d+/(\d+)/std(?:out|err)\.log$")
_FACTS, _WATCHDOG, _FAULT = run_files.FACTS_NAME, run_files.WATCHDOG_NAME, run_files.FAULTHANDLER_NAME


def join(head: str, tail: str) -> str:
    """A message wrapped onto the next line, read as one line: the two joined by one space."""
    return f"{head.rstrip()} {tail.strip()}"


@dataclass
class Held:
    """One line a reader keeps back because its message may go on in the next line: ``hold`` keeps it (replacing
    any held one), ``take`` gives it back once and forgets it, ``clear`` forgets it (at the end of a source)."""

    where: str = ""
    text: str | None = None

    def hold(self, text: str, where: str) -> None:
        self.where, self.text = where, text

    def take(self) -> tuple[str, str] | None:
        if self.text is None:
            return None
        held, self.text = (self.where, self.text), None
        return held

    def clear(self) -> None:
        self.text = None


class _Gunzip(gzip.GzipFile):
    """A gzip stream read to where it is intact: a truncated or damaged end reads as the end of the text (a log
    cut off by a full disk or a killed job), never as an error. Closing it closes the stream it reads."""

    def close(self) -> None:
        inner = self.fileobj
        super().close()
        if inner is not None:
            inner.close()

    def read(self, size: int = -1) -> bytes:
        try:
            return super().read(size)
        except (EOFError, gzip.BadGzipFile, zlib.error):
            return b""

    def readline(self, size: int = -1) -> bytes:
        try:
            return super().readline(size)
        except (EOFError, gzip.BadGzipFile, zlib.error):
            return b""


@dataclass
class TextSource:
    label: str
    path: Path | None = None
    data: bytes | None = None
    rank: str | None = None
    """From the torchrun per-rank folder or the evidence file name; else from each line's prefix."""

    def open(self) -> BinaryIO:
        """The text's bytes; a gzip-compressed file or paste (by its magic bytes) decompressed as it is read, as
        many layers as it has (up to ``MAX_GZIP_LAYERS``; a deeper one is read as the bytes it is)."""
        stream: BinaryIO = io.BytesIO(self.data) if self.data is not None else open(self.path, "rb")
        for _ in range(MAX_GZIP_LAYERS):
            head = stream.read(2)
            stream.seek(0)
            if head != _GZIP_MAGIC:
                break
            stream = _Gunzip(fileobj=stream, mode="rb")  # type: ignore[assignment]
        return stream


@dataclass
class Evidence:
    texts: list[TextSource] = field(default_factory=list)
    faulthandler: list[TextSource] = field(default_factory=list)
    facts: dict[str, dict] = field(default_factory=dict)
    watchdog: list[dict] = field(default_factory=list)
    flight_recorder_dirs: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """'path (why)' for files not read: binary, unreadable facts."""

    @property
    def empty(self) -> bool:
        return not (self.texts or self.faulthandler or self.facts or self.watchdog or self.flight_recorder_dirs)


def collect(paths: list[str], stdin: BinaryIO | None = None) -> Evidence:
    if not paths:
        raise UsageError("PATH", None, "a log file, a run folder, a Slurm output file, or - for a pasted log",
                         "missing")
    ev = Evidence()
    for given in paths:
        if given == "-":
            if stdin is None:
                raise UsageError("PATH", "-", "- only where standard input can be read", "unreadable")
            ev.texts.append(TextSource("<stdin>", data=stdin.read()))
            continue
        p = Path(given)
        if not p.exists():
            raise UsageError("PATH", given, "an existing log file or run folder", "missing")
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file())
            for f in files:
                _sort(ev, f, str(f.relative_to(p)) if f != p else f.name, root=p)
        else:
            _sort(ev, p, str(p), root=p.parent)
    if ev.empty or not _any_content(ev):
        raise UsageError("PATH", " ".join(paths), "logs or a run folder with something in them"
                         + (f" (skipped: {', '.join(ev.skipped[:3])})" if ev.skipped else ""), "nothing to read in")
    return ev


def _any_content(ev: Evidence) -> bool:
    if ev.facts or ev.watchdog or ev.flight_recorder_dirs:
        return True
    for src in ev.texts + ev.faulthandler:
        if src.data is not None:
            if src.data.strip():
                return True
        elif src.path.stat().st_size > 0:
            with src.open() as fh:
                if fh.read(1):
                    return True
    return False


def _sort(ev: Evidence, f: Path, label: str, root: Path) -> None:
    name = f.name
    try:
        if name.startswith(run_files.FR_PREFIX) and f.parent not in ev.flight_recorder_dirs:
            ev.flight_recorder_dirs.append(f.parent)
            return
        if name.startswith(run_files.FR_PREFIX):
            return
        if m := _FACTS.match(name):
            facts = json.loads(f.read_text(errors="replace"))
            if isinstance(facts, dict):
                ev.facts[m.group(1)] = facts
            else:
                ev.skipped.append(f"{label} (not a JSON object)")
            return
        if m := _WATCHDOG.match(name):
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                try:
                    event = json.loads(line)
                except ValueError:
                    ev.skipped.append(f"{label}:{n} (not JSON)")
                    continue
                if isinstance(event, dict):
                    ev.watchdog.append({**event, "where": f"{label}:{n}", "rank": str(event.get("rank", m.group(1)))})
            return
        with TextSource(label, path=f).open() as fh:
            head = fh.read(_PROBE)
        if b"\0" in head:
            ev.skipped.append(f"{label} (binary)")
            return
        rank = (m.group(1) if (m := _FAULT.match(name)) else
                m.group(1) if (m := _RANK_DIR.search(label.replace(os.sep, "/"))) else None)
        (ev.faulthandler if _FAULT.match(name) else ev.texts).append(TextSource(label, path=f, rank=rank))
    except ValueError:
        ev.skipped.append(f"{label} (not JSON)")
    except OSError as e:
        raise UsageError("PATH", str(f), f"a readable file ({e.strerror})", "unreadable") from None


def lines(src: TextSource) -> Iterator[tuple[str, str | None, str, str]]:
    """(file:line, rank, text without prefix, raw text) of every line, a long line's middle left out."""
    with src.open() as fh:
        n = 0
        while True:
            chunk = fh.readline(MAX_LINE)
            if not chunk:
                return
            n += 1
            if not chunk.endswith(b"\n"):  # a long line: keep its start and its end, never all of it
                tail = b""
                while (rest := fh.readline(MAX_LINE)):
                    tail = (tail + rest)[-MAX_LINE:]
                    if rest.endswith(b"\n"):
                        break
                if tail:
                    chunk = chunk + b" ... " + tail
            raw = chunk.decode("utf-8", errors="replace").rstrip("\r\n")
            if "\x1b" in raw:
                raw = _ANSI.sub("", raw)
            rank = src.rank
            if m := _PREFIX.match(raw):
                rank = rank or m.group(1) or m.group(2)
                text = raw[m.end():]
            else:
                text = raw
            yield f"{src.label}:{n}", rank, text, raw
