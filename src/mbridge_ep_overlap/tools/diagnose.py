"""``mbridge-ep-overlap diagnose PATH... | -``: what went wrong in a run, from what it left behind.

Contract: PATHs are log files, run folders (with the ``evidence/`` folder every launched run writes),
Slurm output files, or ``-`` for a log pasted on standard input. Prints the diagnosis on stdout
(``diagnose.Diagnosis.lines``; ``--json`` for the same as JSON). Exit 0 nothing wrong found, 1 a
problem found (recognised or not), 2 bad usage (a missing or unreadable path, nothing to read), one
line on stderr, no traceback.
"""

from __future__ import annotations

import json
import sys

from ..diagnose import diagnose


def add_parser(sub) -> None:
    p = sub.add_parser("diagnose", help="name the cause of a hang, crash, upstream error, bad numbers or no speed-up")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="log file, run folder, Slurm output, or - for a pasted log; two runs' folders to compare "
                        "(reference first)")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.set_defaults(handler=_main)


def _main(args) -> int:
    result = diagnose(args.paths, stdin=sys.stdin.buffer if "-" in args.paths else None)
    print(json.dumps(result.as_dict(), indent=2) if args.json else "\n".join(result.lines()))
    return result.exit_code
