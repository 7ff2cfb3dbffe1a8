"""Command line: ``mbridge-ep-overlap`` / ``python -m mbridge_ep_overlap``.

Contract
--------
* ``doctor``: this machine in a block to paste into an issue, and a verdict per dispatcher
  (``tools.doctor``).
* ``plan``: build a recipe for a described target and finalize it with MB's real finalize
  (``tools.plan``). Exit 0 accepted, 1 refused (every violation printed).
* ``recipes``: the registered recipes.
* ``bench run|report|tune``: the measurement lab's command (``lab.bench_command``).
* ``verify-log``: a verdict on MB training logs (``tools.verify_log``).
* ``calibrate``: refit the step-time model's cluster inputs from measured rows (``tools.calibrate``).
* ``diagnose``: the cause of a failed or slow run from what it left behind (``tools.diagnose``).
* ``rule ID`` / ``rule --list``: a rule's reference text, as ``docs/rules.md`` has it (``tools.rule``).
``-v`` (before or after the command; or ``EP_OVERLAP_VERBOSE=1``): the libraries' warnings as they wrote
them, instead of import noise in one line and the warnings about the config in a section of their own
(``runtime.upstream_warnings``).
Bad input: one line naming the bad value and the allowed ones, exit 2, no traceback.

Start-up: building the parser imports neither torch nor Megatron; a command imports what it needs
when it runs, so ``--help``, ``verify-log`` and ``bench report`` start in a fraction of a second.
"""

from __future__ import annotations

import argparse
import logging

from ..runtime.exits import OneLineArgumentParser, run_reporting_errors


def _recipes(args: argparse.Namespace) -> int:
    from ..spec import registered_recipes

    for name, entry in sorted(registered_recipes().items()):
        print(f"{name:24s} {entry.num_gpus:5d}x {entry.gpu:6s} {entry.dispatcher or 'kept':9s} {entry.summary}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import main as doctor

    return doctor(args)


def build_parser() -> argparse.ArgumentParser:
    from ..lab import bench_command
    from . import calibrate, diagnose, plan, rule, verify_log

    p = OneLineArgumentParser(prog="mbridge-ep-overlap", description=__doc__.split("\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", dest="verbose_all",
                   help="print every warning the libraries raise as they wrote it (same as EP_OVERLAP_VERBOSE=1)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineArgumentParser)
    sub.add_parser("doctor", help="print this machine's EP-overlap environment and verdicts").set_defaults(handler=_doctor)
    sub.choices["doctor"].add_argument("--smoke", action="store_true", help="run each dispatcher on 2 GPUs")
    sub.add_parser("recipes", help="list the registered recipes").set_defaults(handler=_recipes)
    plan.add_parser(sub)
    bench_command.add_parser(sub)
    verify_log.add_parser(sub)
    diagnose.add_parser(sub)
    calibrate.add_parser(sub)
    rule.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    verbose = args.verbose_all or getattr(args, "verbose", False)
    logging.basicConfig(level=logging.WARNING)
    return run_reporting_errors("mbridge-ep-overlap", lambda: args.handler(args), hold_stderr=not verbose)
