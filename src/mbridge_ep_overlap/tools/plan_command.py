"""``mbridge-ep-overlap plan``: build a recipe for a described target and show what would run.

Contract: the flags map onto a ``RunSpec`` (``tools.flags``); ``build`` configures EP overlap and
evaluates the rule table once; MB's real ``runtime_config_update`` then finalizes the config with
only the target's hardware and version gates simulated. Output: the plan, the finalized fields,
every rule's status and - with ``--predict``, the default when the target spans more than one node
- the predicted step time with overlap off and on for the finalized config (``predict.config``;
which inputs were defaults is said), or all of it as JSON with ``--json`` (``"prediction"``: the
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

from ..core.errors import EPOverlapError, UpstreamRefusal
from .exits import stdout_to_stderr
from .flags import add_spec_arguments, spec_from_args

DEFAULT_RECIPE = "qwen3_moe_proxy"


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="plan and finalize a recipe with EP overlap for a described cluster")
    add_spec_arguments(p, recipe_default=DEFAULT_RECIPE)
    p.add_argument("--json", action="store_true", help="everything as one JSON document on stdout")
    p.add_argument("--predict", action=argparse.BooleanOptionalAction, default=None,
                   help="predicted step time with overlap off and on (docs/prediction.md); "
                        "default: on when the target has more than one node")
    p.set_defaults(handler=main)


def _collect(args: argparse.Namespace) -> tuple[int, dict[str, Any], list[str]]:
    from ..pipeline import build, finalize

    spec = spec_from_args(args)
    out: dict[str, Any] = {"recipe": spec.recipe}
    try:
        built = build(spec)
        out["environment"] = built.target.to_dict()
        result = finalize(built)
    except (EPOverlapError, UpstreamRefusal) as e:
        out.update(accepted=False, violations=[v.to_dict() for v in getattr(e, "violations", [])], error=str(e))
        return 1, out, [f"{spec.recipe}: REFUSED", str(e)]
    rows = built.report.status_rows()
    out.update(plan=built.plan.to_dict() if built.plan else None, finalized=result.summary, accepted=True,
               rules=[dict(zip(("rule", "status", "detail"), row)) for row in rows])
    lines = [built.plan.to_table() if built.plan else "EP overlap off (as asked)", "",
             "finalized by Megatron-Bridge (runtime_config_update, target simulated):"]
    lines += [f"  {line}" for line in result.lines()]
    width = max(len(r[0]) for r in rows)
    lines += ["", "rules:"] + [f"  {rule_id:{width}s}  {status:11s}  {detail}" for rule_id, status, detail in rows]
    out["prediction"] = None
    if args.predict if args.predict is not None else (built.target.num_nodes or 1) > 1:
        out["prediction"], more = _prediction(built)
        lines += ["", *more]
    state = "ACCEPTED with EP overlap on" if built.plan else "ACCEPTED with EP overlap off"
    lines.append(f"\n{spec.recipe} on {built.target.source}: {state}")
    return 0, out, lines


def _prediction(built) -> tuple[dict[str, Any], list[str]]:
    """The step-time prediction of the finalized config on the target: (JSON object, lines)."""
    from ..predict.config import CannotPredict, for_config

    try:
        cp = for_config(built.cfg, built.target)
    except CannotPredict as e:
        return {"error": e.reason}, [f"predicted step time: not made ({e.reason})"]
    return cp.to_dict(), ["predicted step time (step-time model, docs/prediction.md):", *cp.lines()]


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
    with stdout_to_stderr():
        code, data, lines = _collect(args)
    print(json.dumps(strict_json(data), indent=2, allow_nan=False) if args.json else "\n".join(lines))
    return code
