"""``mbridge-ep-overlap rule ID`` / ``rule --list``: a rule's reference text on the command line.

Contract: ``rule ID`` prints the rule's section of ``docs/rules.md`` (``tools.rule_docs.rule_text``,
the same characters), exit 0; ``rule --list`` prints every rule id with its severity and message,
one a line, exit 0; an unknown id (or neither an id nor ``--list``, or both) is bad usage: one line
on stderr naming the closest ids, exit 2. Loads no Megatron package.
"""

from __future__ import annotations

import argparse
import difflib

from ..base.errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("rule", help="print a rule's reference text (docs/rules.md), or --list them all")
    p.add_argument("rule_id", nargs="?", metavar="ID", help="a rule id, as a refusal line names it")
    p.add_argument("--list", action="store_true", help="every rule id, its severity and its message")
    p.set_defaults(handler=_main)


def _main(args: argparse.Namespace) -> int:
    # start-up speed: the rule table (and the prediction code a rule reads) loads only when the command runs
    from ..core.rules import RULES, RULES_BY_ID
    from .rule_docs import rule_text

    if args.list and args.rule_id is not None:
        raise UsageError("rule ID", args.rule_id, "an ID or --list, not both", "invalid")
    if not args.list and args.rule_id is None:
        raise UsageError("rule ID", None, "give one (a refusal line names it), or --list", "missing")
    if args.list:
        width = max(len(r.id) for r in RULES)
        print("\n".join(f"{r.id:{width}s}  {r.severity.value:7s}  {r.message}" for r in RULES))
        return 0
    rule = RULES_BY_ID.get(args.rule_id)
    if rule is None:
        close = difflib.get_close_matches(args.rule_id, list(RULES_BY_ID), n=3, cutoff=0.5)
        hint = (f"a rule id, closest: {', '.join(close)}" if close else
                f"one of the {len(RULES)} rule ids (mbridge-ep-overlap rule --list)")
        raise UsageError("rule", args.rule_id, hint)
    print(rule_text(rule), end="")
    return 0
