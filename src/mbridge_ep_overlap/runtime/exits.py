"""The exit-code contract every entry point keeps, in one place.

Contract: 0 ok; 1 refused (``EPOverlapError``: every violation printed, or ``UpstreamRefusal``);
2 bad usage, in one line on stderr (``UsageError``, argparse errors via
``OneLineArgumentParser``, an unreadable or unwritable path); 130 interrupted (one line). Never a
traceback for any of these.
``stdout_to_stderr()`` keeps a command's stdout for its own output (JSON, a job script) while
Megatron logs to stdout. ``run_reporting_errors(..., hold_stderr=True)`` holds what is written to
stderr and stdout while a command prepares (importing Megatron alone prints ~25 warning lines on a
machine without TE/APEX/CUDA, and ``megatron.training`` routes the root logger to stdout at INFO):
on bad usage only the one line is printed, stdout stays empty; on any other outcome the held text
is written out, each to its own stream, except the libraries' warnings: those are collected
meanwhile (``runtime.upstream_warnings``) and written after it - import noise in one line with its
count, warnings about the run de-duplicated in a section of their own. ``release_stderr()`` ends the hold early, before
work whose output must stream (training, launches, the smoke check). Nothing is held in a torchrun
rank (its stderr is its log) or with ``EP_OVERLAP_VERBOSE=1``; faulthandler keeps writing to the
real stderr during a hold (``crash_stream``).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import sys
import tempfile
from typing import Callable, Iterator

from ..base.errors import EPOverlapError, UpstreamRefusal, UsageError
from .upstream_warnings import Collector


class ReportedRefusal(Exception):
    """A refusal whose report (every violation) a command has already printed on stdout: exit 1, and
    one line on stderr saying so."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad usage as one line on stderr and exits 2 (no usage dump).

    ``moved``: for a command whose spelling changed, the line naming the new spelling when the
    arguments use the old one (then bad usage, exit 2: an old spelling is never silently taken)."""

    moved: Callable[[list[str]], str | None] | None = None

    def parse_known_args(self, args=None, namespace=None):
        if self.moved is not None and args is not None:
            line = self.moved(list(args))
            if line:
                self.error(line)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:
        print(f"{self.prog}: error: {' '.join(message.split())}", file=sys.stderr)
        raise SystemExit(2)


def positive_int(text: str) -> int:
    """argparse ``type`` for sizes and counts: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse ``type`` for counts that may be zero (warm-up iterations): an integer >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
    return value


def run_reporting_errors(prog: str, action: Callable[[], int], hold_stderr: bool = False) -> int:
    """``action()``'s own exit code; 1 for a refused config (every violation printed); 2 for bad
    usage or a path that cannot be read or written (one line). Never a traceback for either.
    ``hold_stderr``: what the libraries write to stderr is held meanwhile (module docstring)."""
    hold = None
    try:
        hold = _Hold.start() if hold_stderr else None
        code = action()
        _end(hold, replay=code != 2)  # an action's own exit 2 has printed its one line
    except UsageError as e:
        _end(hold, replay=False)
        return _say(f"{prog}: error: {' '.join(str(e).split())}", 2)
    except ReportedRefusal as e:
        _end(hold, replay=True)
        return _say(f"{prog}: {e} (every violation is listed on stdout)", 1)
    except (EPOverlapError, UpstreamRefusal) as e:
        _end(hold, replay=True)
        return _say(f"{prog}: {e}", 1)
    except BrokenPipeError:  # the reader of stdout went away (`| head`): the conventional SIGPIPE code
        _end(hold, replay=False)
        _silence_stdout()
        return 141
    except OSError as e:  # a path given on the command line
        _end(hold, replay=False)
        where = f" {e.filename!r}" if e.filename else ""
        return _say(f"{prog}: error: cannot use{where}: {e.strerror or e}", 2)
    except KeyboardInterrupt:  # Ctrl-C (or a recipe raising it): the conventional 130, no traceback
        _end(hold, replay=False)
        return _say(f"{prog}: interrupted", 130)
    except BaseException:
        _end(hold, replay=True)
        raise
    return code


def _say(line: str, code: int) -> int:
    """Print the answer's line on stderr and return ``code`` - the same code when stderr cannot be
    written (``2>/dev/full``): a script must not read bad usage as a refusal."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(line, file=sys.stderr, flush=True)
    return code


def _silence_stdout() -> None:
    """After a broken pipe, the interpreter's final flush of stdout must not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


class _Held:
    """One file descriptor pointed at a temporary file until ``restore()``; ``saved_fd`` is the real one."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.file = tempfile.TemporaryFile()
        self.saved_fd = os.dup(fd)
        try:
            os.dup2(self.file.fileno(), fd)
        except OSError:
            os.close(self.saved_fd)
            self.file.close()
            raise

    def restore(self) -> None:
        os.dup2(self.saved_fd, self.fd)

    def close(self) -> bytes:
        """What was held (the real descriptor closed: call after ``restore``)."""
        os.close(self.saved_fd)
        self.file.seek(0)
        data = self.file.read()
        self.file.close()
        return data


def _hold_stdout() -> _Held | None:
    if sys.stdout is None:
        return None
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    try:
        return _Held(1)
    except OSError:  # a closed stdout: nothing to keep clean
        return None


class _Hold:
    """stderr and stdout held: file descriptors 2 and 1 point at temporary files, so what C libraries,
    logging handlers (``megatron.training``'s root handler writes to stdout) and Python's warnings
    write there waits. ``sys.stderr`` / ``sys.stdout`` themselves are left alone (they write to the
    descriptors): a handler created meanwhile keeps working after the hold. faulthandler, when
    enabled, writes to the real stderr throughout, so a native crash while held is still reported."""

    current: "_Hold | None" = None

    def __init__(self) -> None:
        sys.stderr.flush()
        self.err = _Held(2)
        self.saved_fd = self.err.saved_fd
        self.out = _hold_stdout()
        self.warnings = Collector().start()
        self.faulthandler = faulthandler.is_enabled()
        if self.faulthandler:
            faulthandler.enable(file=self.saved_fd, all_threads=True)

    @classmethod
    def start(cls) -> "_Hold | None":
        """A hold, or None where holding would hide what must be seen or cannot work: nested, asked
        off (``EP_OVERLAP_VERBOSE=1``), a torchrun rank (its stderr is its log: a hang's evidence),
        no usable stderr."""
        if (cls.current is not None or os.environ.get("EP_OVERLAP_VERBOSE") == "1" or "LOCAL_RANK" in os.environ
                or sys.stderr is None):
            return None
        try:
            cls.current = cls()
        except (OSError, ValueError, AttributeError):  # a closed or odd stderr: nothing is held
            cls.current = None
        return cls.current

    def end(self, replay: bool) -> None:
        """Restore both streams; with ``replay`` write out what each held (a reader of stdout that went
        away raises ``BrokenPipeError`` here, as it would have while the command printed)."""
        for stream in (sys.stderr, sys.stdout):
            with contextlib.suppress(Exception):
                stream.flush()
        self.warnings.stop()
        self.err.restore()
        if self.faulthandler or faulthandler.is_enabled():  # enabled meanwhile: it wrote to fd 2
            faulthandler.enable(file=sys.__stderr__ if sys.__stderr__ is not None else 2, all_threads=True)
        err = self.err.close()
        out = b""
        if self.out is not None:
            self.out.restore()
            out = self.out.close()
        _Hold.current = None
        if replay and err:
            with contextlib.suppress(Exception):
                sys.stderr.write(err.decode(errors="replace"))
                sys.stderr.flush()
        if replay and out and sys.stdout is not None:
            buffer = getattr(sys.stdout, "buffer", None)
            if buffer is not None:
                buffer.write(out)
            else:
                sys.stdout.write(out.decode(errors="replace"))
            sys.stdout.flush()
        if replay and self.warnings.summary():
            with contextlib.suppress(Exception):
                sys.stderr.write("\n".join(self.warnings.summary()) + "\n")
                sys.stderr.flush()


def _end(hold: _Hold | None, replay: bool) -> None:
    if hold is not None and _Hold.current is hold:
        hold.end(replay)


def crash_stream():
    """Where faulthandler should write: the real stderr, also while it is held."""
    hold = _Hold.current
    return hold.saved_fd if hold is not None else sys.__stderr__


def release_stderr() -> None:
    """End a hold (stderr and stdout) now and write out what it held (no-op when nothing is held):
    call it before work whose output must reach the user as it happens."""
    if _Hold.current is not None:
        _Hold.current.end(replay=True)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Inside: file descriptor 1 and ``sys.stdout`` point at stderr, so Megatron's log lines cannot
    mix into a command's own output, which it prints after the block."""
    sys.stdout.flush()
    saved_fd, saved = os.dup(1), sys.stdout
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
        sys.stdout = saved
