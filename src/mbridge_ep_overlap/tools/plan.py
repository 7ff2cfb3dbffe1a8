"""``mbridge-ep-overlap plan``: build a recipe for a described target and show what would run.

Contract: the flags map onto a ``RunSpec`` (``runtime.flags``); ``build`` configures EP overlap and
evaluates the rule table once; MB's real ``runtime_config_update`` then finalizes the config with
only the target's hardware and version gates simulated. Output (``tools.plan_report``, the layout
``run_script.py --dryrun`` and ``launch_slurm.py`` share; on stdout, refusals included; the libraries'
warnings on stderr): the verdict, what changed and why, the rules that fail, advise or could not be
checked (every rule with ``--rules``), the finalized fields and - with ``--predict``, the default
when the target spans more than one node - the predicted step time with overlap off and on for the finalized config (``core.prediction``;
which inputs were defaults is said; ``--calibration FILE``: with that cluster calibration,
named in the report and in the JSON's ``"calibration"``), or all of it as JSON with ``--json`` (``"prediction"``: the
prediction, ``{"error": why}`` when none can be made, null when not asked; stdout then carries the
JSON alone, Megatron's log lines go to stderr). The JSON is strict (RFC 8259): a non-finite number
that reaches it - a config value such as ``inf`` shown in a violation - is written as the string
``"inf"`` / ``"-inf"`` / ``"nan"``, never as ``Infinity`` / ``NaN``; predictions are finite or not
made. Exit 0 when accepted, 1 when refused (every violation printed), 2 for bad usage. Works on a
CPU machine without TE or hub access.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from ..runtime.flags import add_spec_arguments, spec_from_args
from .calibrate import judged_with
from .plan_report import judge

_DEFAULT_RECIPE = "qwen3_moe_proxy"


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="plan and finalize a recipe with EP overlap for a described cluster")
    add_spec_arguments(p, recipe_default=_DEFAULT_RECIPE)
    p.add_argument("--json", action="store_true", help="everything as one JSON document on stdout")
    p.add_argument("--predict", action=argparse.BooleanOptionalAction, default=None,
                   help="predicted step time with overlap off and on (docs/prediction.md); "
                        "default: on when the target has more than one node")
    p.add_argument("--calibration", metavar="FILE", help="predict with this cluster calibration (written by calibrate)")
    p.add_argument("--rules", action="store_true",
                   help="every rule of the table (default: only those that fail, advise or could not be checked)")
    p.set_defaults(handler=main)


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its name ("inf", "-inf", "nan") and every int
    too long for Python to print (``sys.get_int_max_str_digits``) by its size."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    limit = sys.get_int_max_str_digits()  # 0: no limit; a digit is ~3.3 bits, so 3 per digit errs early
    if isinstance(value, int) and limit and abs(value).bit_length() > 3 * limit:
        return f"a {abs(value).bit_length()}-bit integer"
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def main(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    outcome = (judge(spec, predict=args.predict, all_rules=args.rules) if getattr(args, "calibration", None) is None
               else judged_with(args.calibration, spec, predict=args.predict, all_rules=args.rules))
    print(json.dumps(strict_json(outcome.data), indent=2, allow_nan=False) if args.json else "\n".join(outcome.lines))
    return outcome.code
