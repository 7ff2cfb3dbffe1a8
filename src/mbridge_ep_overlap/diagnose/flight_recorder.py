"""Flight-recorder dumps, read with torch's own analyzer (``torch.distributed.flight_recorder.fr_trace``).

Contract
--------
``analyze(folder, prefix)`` runs the analyzer the way its module does (``python -m
torch.distributed.flight_recorder.fr_trace FOLDER -p PREFIX --print_stack_trace``) in a subprocess of
this interpreter, so a dump it cannot read costs an explanation, not this process, and parses what it
prints: one ``Mismatch`` per collective it reports ("Not all ranks joining collective", "Input/output
mismatch", "... has errors"), with the sequence number, group, collective, missing ranks and the
Python frames it printed. The analyzer's failure (no torch, an unreadable dump, a timeout) comes back
as ``FlightRecorderResult.error`` with its last line; nothing raises.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..base import run_files

TIMEOUT_S = 120
_START = re.compile(r"^(Not all ranks joining collective,|Input/output mismatch in the collective|Collective) "
                    r"sequence number:? (\d+)")
_KEY = re.compile(r"^(internal record id|group info|collective|missing ranks|input sizes|output sizes|world size|"
                  r"expected ranks|collective state|error msg): ?(.*)$")
_FRAME = re.compile(r"^\s*(\S+) at (.+):(\d+)\s*$")


@dataclass
class Mismatch:
    kind: str
    sequence: int
    fields: dict[str, str] = field(default_factory=dict)
    frames: list[tuple[str, str, int]] = field(default_factory=list)
    """(function, file, line), innermost first, as the analyzer prints them."""
    line: str = ""

    @property
    def missing_ranks(self) -> str:
        return self.fields.get("missing ranks", "")

    @property
    def collective(self) -> str:
        return self.fields.get("collective", "?")


@dataclass
class FlightRecorderResult:
    folder: Path
    mismatches: list[Mismatch] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    error: str | None = None


def analyze(folder: Path, prefix: str = run_files.FR_PREFIX) -> FlightRecorderResult:
    result = FlightRecorderResult(folder)
    cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder), "-p", prefix,
           "--print_stack_trace"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        result.error = f"torch's flight-recorder analyzer did not finish in {TIMEOUT_S} s"
        return result
    except OSError as e:
        result.error = f"torch's flight-recorder analyzer could not start ({e.strerror})"
        return result
    text = done.stdout + "\n" + done.stderr
    result.output = [line for line in text.splitlines() if line.strip()]
    result.mismatches = parse(text)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()]
        result.error = (f"torch's flight-recorder analyzer failed on {folder} (exit {done.returncode}): "
                        + (last[-1] if last else "no output"))
    return result


def parse(text: str) -> list[Mismatch]:
    found: list[Mismatch] = []
    current: Mismatch | None = None
    in_stack = False
    for line in text.splitlines():
        if m := _START.match(line.strip()):
            current = Mismatch(m.group(1), int(m.group(2)), line=line.strip())
            found.append(current)
            in_stack = False
            continue
        if current is None:
            continue
        if line.strip().startswith("collective stack trace"):
            in_stack = True
            continue
        if in_stack and (f := _FRAME.match(line)):
            current.frames.append((f.group(1), f.group(2), int(f.group(3))))
            continue
        if (k := _KEY.match(line.strip())) and not in_stack:
            current.fields[k.group(1)] = k.group(2).strip()
        elif line.strip():
            in_stack = False
    return found
