"""The plan as a user reads it: one renderer for ``plan``, ``run_script.py --dryrun`` and ``launch_slurm.py``.

Contract: ``judge(spec, ...)`` builds the spec (``pipeline.build``) and finalizes it with MB's real
``runtime_config_update`` for the target (``pipeline.finalize``), Megatron's own prints sent to stderr
meanwhile, and returns an ``Outcome``: the exit code (0 accepted, 1 refused), the lines of the report
and the same as data for ``--json``. A bad spec raises ``UsageError`` (exit 2, one line, from the caller).
The report, in this order:

1. **the verdict**, one line: ``<recipe> on <target>: ACCEPTED with EP overlap on|off`` or ``REFUSED``,
   what overlap does on this target - which dispatcher's all-to-all it hides behind how many
   microbatches, or, first, that it has **nothing to pair** (one microbatch per rank per step) - and the predicted
   step time with overlap off and on when a prediction was asked for and made;
2. what changed and why: each field ``old -> new`` with the plan's reason (its provenance words are the
   plan's, never recomputed here), the environment variables, the dispatcher, delayed wgrad, stream,
   and a warning of the build that the final rule evaluation no longer reports (fixed by ``resolve``);
3. only the rules that fail, advise or could not be checked (each with its message and fix); every rule
   of the table with ``all_rules``;
4. the fields as MB finalized them (``name: value  (source)``, one a line, the source one of
   ``core.provenance.Source``'s words: ``finalized_sources``) and the prediction's details.

Where it goes is the callers' contract, the same for all three: the report is the command's result and
goes to **stdout**, refusals included; diagnostics (the libraries' warnings, Megatron's logging) go to
**stderr**. ``launch_slurm.py`` writes the report as ``#`` comment lines of the job script, after
its ``#SBATCH`` header (``into_script``), so what it prints stays a script ``sbatch`` accepts; its refusal is printed on
stdout like the others (``for_job``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import EPOverlapError, UpstreamRefusal
from ..base.values import short
from ..core.provenance import Source, strongest
from ..target.simulated_finalize import SUMMARY_FIELDS
from ..runtime.exits import ReportedRefusal, stdout_to_stderr

_QUIET = ("pass", "n/a")


@dataclass
class Outcome:
    code: int
    lines: list[str]
    data: dict[str, Any] = field(default_factory=dict)
    built: Any = None


def judge(spec, *, predict: bool | None = False, all_rules: bool = False, calibration=None) -> Outcome:
    """Build, finalize and render ``spec`` (module docstring). ``predict=None``: predict when the target
    spans more than one node; ``calibration`` (a ``predict.Calibration``): predict with it in place of
    the shipped one."""
    from ..pipeline import build, finalize

    data: dict[str, Any] = {"recipe": spec.recipe}
    # the report prints every warning and advice of the plan: the library's own log line of each would
    # say it a second time on stderr
    ours = logging.getLogger("mbridge_ep_overlap")
    level, ours.level = ours.level, logging.ERROR
    built = None
    try:
        with stdout_to_stderr():
            built = build(spec)
            data["environment"] = built.target.to_dict()
            result = finalize(built)
    except (EPOverlapError, UpstreamRefusal) as e:
        where = built.target.source if built is not None else _target_words(spec)
        violations = list(getattr(e, "violations", []))
        data.update(accepted=False, violations=[v.to_dict() for v in violations], error=str(e))
        return Outcome(1, refusal_lines(spec.recipe, where, e), data, built)
    finally:
        ours.level = level
    rows = built.report.status_rows()
    sources = finalized_sources(built, result.summary)
    data.update(plan=built.plan.to_dict() if built.plan else None, finalized=result.summary, accepted=True,
                finalized_sources={k: v.value for k, v in sources.items()},
                rules=[dict(zip(("rule", "status", "detail"), row)) for row in rows])
    prediction, prediction_lines = None, []
    if predict if predict is not None else (built.target.num_nodes or 1) > 1:
        prediction, prediction_lines = _prediction(built, calibration)
    data["prediction"] = prediction
    lines = [verdict(built, result.summary, prediction), ""]
    lines += change_lines(built.plan) + settled_lines(built.plan, built.report)
    lines += ["", *rule_lines(built.report, rows, all_rules)]
    lines += ["", "finalized by Megatron-Bridge (runtime_config_update, target simulated):",
              *(f"{k}: {v}  ({sources[k].value})" for k, v in result.summary.items())]
    if prediction_lines:
        lines += ["", *prediction_lines]
    return Outcome(0, lines, data, built)


_PLAN_CHOICES = {"moe_token_dispatcher_type": "dispatcher_source", "moe_flex_dispatcher_backend": "dispatcher_source",
                 "delay_wgrad_compute": "delay_wgrad_source", "high_priority_a2a_comm_stream": "high_priority_a2a_source"}
_DERIVED = {"data_parallel_size": ("world_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                                   "context_parallel_size"),
            "num_microbatches": ("global_batch_size", "micro_batch_size", "data_parallel_size")}


def finalized_sources(built, summary: dict[str, Any]) -> dict[str, Source]:
    """Who set each finalized field: a ``resolve='auto'`` edit, else an override (``--set``), else the
    plan's own choice or edit, else a flag of the spec (requested), else the recipe. A derived field
    (data-parallel size, microbatches) takes the latest hand among its inputs (``provenance.strongest``)."""
    spec, plan = built.spec, built.plan
    paths = dict(SUMMARY_FIELDS)
    overridden = {item.partition("=")[0] for item in spec.overrides}

    def source(name: str) -> Source:
        if name == "world_size":
            return Source.REQUESTED if spec.target.num_gpus else Source.RECIPE
        if name in _DERIVED:
            return strongest([source(n) for n in _DERIVED[name]])
        if name == "CUDA_DEVICE_MAX_CONNECTIONS":
            path = f"env_vars.{name}"
            return (Source.OVERRIDE if path in overridden else
                    (plan.env_source(name) if plan is not None else None) or Source.RECIPE)
        path = paths[name]
        twins = {path, path.replace("model.", "comm_overlap.", 1)}
        changes = [c for c in (plan.changes if plan is not None else []) if c.path in twins]
        if any(c.source is Source.RESOLVE for c in changes):
            return Source.RESOLVE
        if twins & overridden:
            return Source.OVERRIDE
        if plan is None and name in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute"):
            return Source.REQUESTED  # turned off as asked
        if plan is not None and name in _PLAN_CHOICES:
            return getattr(plan, _PLAN_CHOICES[name])
        if changes:
            return changes[-1].source
        return Source.REQUESTED if getattr(spec, name, None) is not None else Source.RECIPE

    return {name: source(name) for name in summary}


def _target_words(spec) -> str:
    """The target of a spec refused before its target was built: the described GPUs, else the recipe's."""
    from ..spec import resolve_recipe

    t = spec.target
    if t.this_machine:
        return "this machine"
    entry = resolve_recipe(spec.recipe).entry
    gpu, num = t.gpu or entry.gpu, t.num_gpus or entry.num_gpus
    return f"described: {num or '?'}x {gpu or '?'}"


def verdict(built, finalized: dict[str, Any], prediction: dict[str, Any] | None) -> str:
    """The first line: accepted, what overlap does on this target, the prediction."""
    head = f"{built.spec.recipe} on {built.target.source}: "
    if built.plan is None:
        return head + "ACCEPTED with EP overlap off (as asked)"
    micro = finalized.get("num_microbatches")
    what = f"ACCEPTED with EP overlap on ({built.plan.dispatcher})"
    if isinstance(micro, int) and micro < 2:
        gbs, mbs, dp = (finalized.get(k) for k in ("global_batch_size", "micro_batch_size", "data_parallel_size"))
        what += (f" - but {micro} microbatch per rank: overlap has nothing to pair (global_batch_size {gbs} / "
                 f"(micro_batch_size {mbs} x data-parallel size {dp})); raise global_batch_size to "
                 f"{2 * (mbs or 1) * (dp or 1)} or more (--resolve auto does)")
    elif isinstance(micro, int):
        what += f": the {built.plan.dispatcher} dispatch and combine hidden behind expert compute of {micro} microbatches"
    if prediction and "error" not in prediction:
        what += (f"; predicted {prediction['off_step_s']:.4g} s -> {prediction['on_step_s']:.4g} s per step "
                 f"({prediction['speedup']:.3f}x)")
    elif prediction:
        what += f"; no step-time prediction ({prediction['error']})"
    return head + what


def refusal_lines(recipe: str, where: str, error: Exception) -> list[str]:
    """The verdict of a refused config and every violation (``str(error)`` lists them)."""
    return [f"{recipe} on {where}: REFUSED", str(error)]


def change_lines(plan) -> list[str]:
    """What the plan changed and why (``OverlapPlan.change_lines``)."""
    if plan is None:
        return ["EP overlap off (as asked): no overlap plan; the finalized fields below are what the run gets"]
    return plan.change_lines()


def settled_lines(plan, report) -> list[str]:
    """The plan's warnings the final rule evaluation no longer reports (``resolve='auto'`` fixed them):
    what was found, and how it was settled, so nothing the build ran into is left unsaid."""
    if plan is None:
        return []
    current = {v.rule_id for v in report.violations}
    return [f"  {w.severity.value.upper()}: {w.rule_id}: {w.message} (found {w.field} = {short(w.current, 400)}). "
            f"Fix: {w.fix}" for w in plan.warnings if w.rule_id not in current]


def rule_lines(report, rows: list[tuple[str, str, str]], all_rules: bool) -> list[str]:
    """The rules that fail, advise or could not be checked - each once, with message and fix - or, with
    ``all_rules``, every row of the table."""
    shown = rows if all_rules else [r for r in rows if r[1] not in _QUIET]
    head = (f"rules ({len(rows)}):" if all_rules else
            f"rules that fail, advise or could not be checked ({len(shown)} of {len(rows)}; --rules lists all):")
    if not shown:
        return [head, "  (none)"]
    by_id = {v.rule_id: v for v in report.violations}
    width = max(len(r[0]) for r in shown)
    out = [head]
    for rule_id, status, detail in shown:
        v = by_id.get(rule_id)
        if v is None:
            out.append(f"  {rule_id:{width}s}  {status:11s}  {detail}")
            continue
        out.append(f"  {rule_id:{width}s}  {status:11s}  {v.message}")
        out.append(f"  {'':{width}s}  {'':11s}  found: {v.field} = {short(v.current, 400)}; required {v.required}")
        out.append(f"  {'':{width}s}  {'':11s}  fix: {v.fix}")
    return out


def _prediction(built, calibration=None) -> tuple[dict[str, Any], list[str]]:
    """The step-time prediction of the finalized config on the target: (JSON object, lines)."""
    from ..core.prediction import CannotPredict, for_config

    try:
        cp = for_config(built.cfg, built.target, calibration=calibration)
    except CannotPredict as e:
        return {"error": e.reason}, [f"predicted step time: not made ({e.reason})"]
    return cp.to_dict(), ["predicted step time (step-time model, docs/prediction.md):", *cp.lines()]


def for_job(spec) -> Outcome:
    """``judge(spec)`` for a job script: a refusal's report is printed on stdout and raised as
    ``ReportedRefusal`` (exit 1)."""
    outcome = judge(spec)
    if outcome.code:
        print("\n".join(outcome.lines), flush=True)
        raise ReportedRefusal(outcome.lines[0])
    return outcome


def into_script(script: str, outcome: Outcome) -> str:
    """``script`` with the report as ``#`` comment lines right after its ``#!`` line and ``#SBATCH``
    header, before its first command."""
    lines = script.split("\n")
    at = next((i for i, line in enumerate(lines) if i and not line.startswith("#SBATCH")), len(lines))
    return "\n".join([*lines[:at], *(f"# {line}".rstrip() for line in outcome.lines), *lines[at:]])
