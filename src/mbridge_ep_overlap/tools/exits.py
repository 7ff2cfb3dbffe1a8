"""The exit-code contract every entry point keeps, in one place.

Contract: 0 ok; 1 refused (``EPOverlapError``: every violation printed, or ``UpstreamRefusal``);
2 bad usage, in one line on stderr (``UsageError``, argparse errors via
``OneLineArgumentParser``, an unreadable or unwritable path). Never a traceback for any of these.
``stdout_to_stderr()`` keeps a command's stdout for its own output (JSON, a job script) while
Megatron logs to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Callable, Iterator

from ..core.errors import EPOverlapError, UpstreamRefusal, UsageError


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad usage as one line on stderr and exits 2 (no usage dump)."""

    def error(self, message: str) -> None:
        print(f"{self.prog}: error: {' '.join(message.split())}", file=sys.stderr)
        raise SystemExit(2)


def positive_int(text: str) -> int:
    """argparse ``type`` for sizes and counts: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def run_reporting_errors(prog: str, action: Callable[[], int]) -> int:
    """``action()``'s own exit code; 1 for a refused config (every violation printed); 2 for bad
    usage or a path that cannot be read or written (one line). Never a traceback for either."""
    try:
        return action()
    except UsageError as e:
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except (EPOverlapError, UpstreamRefusal) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a path given on the command line
        where = f" {e.filename!r}" if e.filename else ""
        print(f"{prog}: error: cannot use{where}: {e.strerror or e}", file=sys.stderr)
        return 2


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
