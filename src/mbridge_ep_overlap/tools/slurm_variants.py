"""``launch_slurm.py --variants off,overlap,...``: one Slurm job array, task i runs variant i.

Contract
--------
The variant names are bench's (``bench.parse_variants``, ``bench.VARIANTS``); ``off`` is added first
when missing, as bench does (every variant's baseline, and the report's). Every variant is the same
``RunSpec`` - recipe, seed, data, steps, shape, overrides, target - changed only as bench changes it
(``bench.variant_spec``); a run flag a variant sets (``--ep-overlap off``, ``--dispatcher``,
``--delay-wgrad``, ``--a2a-priority``) is bad usage naming it. Before anything is written every
variant is built, finalized and judged as ``plan`` judges it (``plan_report.judge``); when any is
refused, the report of each refused variant is printed (every violation) and the submission is
refused whole (exit 1), nothing written.

Written into ``--log-dir`` (the run folder, absolute; made here, as for one job):

* ``<job>.sbatch``: ``#SBATCH --array=0-N``; task i selects variant i in a ``case`` on
  ``SLURM_ARRAY_TASK_ID`` (its exports - the variant's plan and recipe variables, multicast off -
  and its spec file), prints the variant and its files, and runs ``srun`` ->
  ``torchrun`` -> ``run_script.py --spec "$SPEC_FILE"`` with its rank logs under ``runs/<link>__<variant>/torchrun`` and
  its evidence summary ``runs/<link>__<variant>/summary.json`` - bench's layout (``bench.run_name``,
  link ``nvlink``: the machine as it is), which ``bench report`` reads; Slurm's output of task i is
  ``<job>-<array id>_<i>.out``;
* per variant ``<job>.<variant>.config.yaml`` (finalized, plain Megatron-Bridge),
  ``<job>.<variant>.plan.json`` (spec, plan, finalized fields, prediction, job size) and
  ``<job>.<variant>.spec.json``, the run description its task runs (``runtime.spec_file``); the baseline of
  every variant is the ``off`` task (task 0), whose config is ``<job>.off.config.yaml``; the rollback
  is that task alone, ``sbatch --array=0 <job>.sbatch`` (sbatch's ``--array`` wins over the script's);
* ``variants.json`` (``results.MANIFEST_SCHEMA``): the job, the cluster (GPU kind, GPUs, GPUs per
  node) and each task's variant, folder and steady-window start - what ``bench report`` reads
  (``results.read_manifest``, ``array_rows``, ``predict_rows``) to name each task's row and to
  predict its step for that cluster.

The confirmation (``cost_lines``) shows the array's size and total GPU-hours (tasks x GPUs x time
limit) and each variant's predicted step.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import UsageError
from ..spec import resolve_recipe
from . import plan_report
from ..core import export
from ..lab.bench import _VARIANT_SYNTAX, parse_variants, run_name, variant_spec
from .plan import strict_json
from ..runtime.exits import ReportedRefusal, stdout_to_stderr
from .slurm_script import ENV_COMMENT, RENDEZVOUS, JobFiles, export_lines, header, launch_line, job_prediction, plan_json
from .slurm_values import format_minutes
from ..runtime.spec_file import write_spec

from ..lab.results import LINK, MANIFEST, MANIFEST_SCHEMA  # noqa: F401 - the run folder's names, owned by its reader
WARMUP = 3
"""Steps left out of the median as bench's default ``--warmup`` (fewer when the run is shorter)."""
# the run flags a variant sets, and bench's syntax that does it (bench._VARIANT_SYNTAX)
_SET_BY_VARIANT = (("ep_overlap", "--ep-overlap", "on"), ("dispatcher", "--dispatcher", None),
                   ("delay_wgrad", "--delay-wgrad", None), ("a2a_priority", "--a2a-priority", None))


@dataclass
class Task:
    """One array task: its variant, spec, plan outcome and built sides."""

    index: int
    variant: str
    spec: object
    outcome: object = None
    side: object = None

    @property
    def folder_name(self) -> str:
        return run_name(LINK, self.variant)


def variant_names(args: argparse.Namespace) -> list[str]:
    """``--variants`` as bench reads it, ``off`` first when missing; a run flag a variant sets is
    bad usage (the variant would silently replace it)."""
    given = [(flag, getattr(args, dest)) for dest, flag, default in _SET_BY_VARIANT if getattr(args, dest) != default]
    if given:
        dest = {flag: d for d, flag, _ in _SET_BY_VARIANT}
        why = "; ".join(f"{flag} ({_VARIANT_SYNTAX[dest[flag]]})" for flag, _ in given)
        raise UsageError("run flags with --variants", " ".join(f"{f} {v}" for f, v in given),
                         f"none of them: each variant sets them - {why}", "unused")
    names = parse_variants(args.variants)
    return names if "off" in names else ["off", *names]


def slug(variant: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", variant)


def plan_tasks(base, names: list[str]) -> list[Task]:
    """Each variant judged as ``plan`` judges it; every refusal printed, then exit 1 (nothing written)."""

    tasks = [Task(i, name, variant_spec(base, name)) for i, name in enumerate(names)]
    for t in tasks:
        with stdout_to_stderr():
            t.outcome = plan_report.judge(t.spec)
    refused = [t for t in tasks if t.outcome.code]
    if refused:
        for t in refused:
            print(f"variant {t.variant} (array task {t.index}):", *t.outcome.lines, "", sep="\n", flush=True)
        raise ReportedRefusal(f"{len(refused)} of {len(tasks)} variants refused ({', '.join(t.variant for t in refused)}): "
                              "nothing submitted or written")
    return tasks


def render_array(args: argparse.Namespace, job: str, log_dir: Path, tasks: list[Task]) -> str:
    """The array job script (module docstring)."""
    q = shlex.quote
    lines = header(args, job, log_dir, output="%x-%A_%a.out", extra=(f"#SBATCH --array=0-{len(tasks) - 1}",))
    lines += ["set -euo pipefail", f"cd {q(args.workdir)}", "",
              f"# one variant per array task, the same recipe, seed, data, steps and shape; {MANIFEST} names them",
              *ENV_COMMENT,
              'case "${SLURM_ARRAY_TASK_ID:?not an array task: submit this script with sbatch}" in']
    for t in tasks:
        folder = log_dir / "runs" / t.folder_name
        files = JobFiles(log_dir, f"{job}.{slug(t.variant)}")
        config, plan = files.config, files.plan
        lines += [f"  {t.index})",
                  f"    VARIANT={q(t.variant)}",
                  f"    RUN_DIR={q(str(folder))}",
                  f"    echo {q(f'variant {t.variant} (array task {t.index}); config: {config}; plan: {plan}')}",
                  *export_lines(t.side.env_vars, t.side.overridden, indent="    "),
                  f"    SPEC_FILE={q(str(files.spec))}",
                  "    ;;"]
    lines += ['  *) echo "array task $SLURM_ARRAY_TASK_ID: no variant (0-' + str(len(tasks) - 1) + ')" >&2; exit 2 ;;',
              "esac",
              'mkdir -p "$RUN_DIR"',
              'echo "variant $VARIANT: logs and summary in $RUN_DIR"',
              "", *RENDEZVOUS, ""]
    lines.append(launch_line(args, ["--spec", '"$SPEC_FILE"', "--output-dir", '"$RUN_DIR"', "--summary-json",
                                    '"$RUN_DIR/summary.json"'],
                             torchrun_extra=("--log-dir", '"$RUN_DIR/torchrun"', "--redirects", "3", "--tee", "3")))
    return "\n".join(lines) + "\n"


def rollback(script: Path) -> str:
    """The overlap-off task alone (task 0): sbatch's ``--array`` wins over the script's."""
    return f"sbatch --array=0 {shlex.quote(str(script))}"


def manifest(args: argparse.Namespace, job: str, tasks: list[Task]) -> dict:
    """``variants.json``: the job, the cluster it runs on and each task's variant and folder."""
    steps = getattr(tasks[0].side.built.cfg.train, "train_iters", None)
    gpu = args.gpu or resolve_recipe(args.recipe).entry.gpu
    return {"schema": MANIFEST_SCHEMA, "job": job, "recipe": args.recipe,
            "cluster": {"gpu": str(gpu).lower() if gpu else None, "num_gpus": args.nodes * args.gpus_per_node,
                        "gpus_per_node": args.gpus_per_node, "nodes": args.nodes},
            "warmup": max(0, min(WARMUP, (steps or 1) - 1)), "steps": steps,
            "tasks": [{"task": t.index, "variant": t.variant, "link": LINK, "folder": f"runs/{t.folder_name}",
                       "config": f"{job}.{slug(t.variant)}.config.yaml", "plan": f"{job}.{slug(t.variant)}.plan.json"}
                      for t in tasks]}


def cost_lines(args: argparse.Namespace, minutes: int | None, tasks: list[Task], predictions: dict[str, dict],
               steps: int | None) -> list[str]:
    """What the array takes, as printed before asking: tasks, size, limit, total GPU-hours, each
    variant's predicted step."""
    gpus = args.nodes * args.gpus_per_node
    n = len(tasks)
    hours = "unbounded (UNLIMITED: the partition's own limit applies)" if minutes is None else (
        f"at most {n * gpus * minutes / 60:.1f} GPU-hours for the array ({n} tasks x {gpus} GPUs x "
        f"{format_minutes(minutes)})")
    lines = [f"  array tasks    : {n} ({', '.join(f'{t.index}={t.variant}' for t in tasks)})",
             f"  nodes x GPUs   : {args.nodes} x {args.gpus_per_node} = {gpus} GPUs per task",
             f"  time limit     : {format_minutes(minutes)} per task",
             f"  GPU-hours      : {hours}",
             f"  partition      : {args.partition or '(the cluster default)'}",
             f"  account        : {args.account or '(your default)'}"]
    for t in tasks:
        p = predictions[t.variant]
        if "error" in p:
            lines.append(f"  predicted step : {t.variant}: not made ({p['error']})")
            continue
        step = p["off_step_s"] if not t.spec.ep_overlap else p["on_step_s"]
        total = f"; {steps} steps {step * steps / 60:.1f} min" if steps else ""
        lines.append(f"  predicted step : {t.variant}: {step:.3f} s (step-time model{total})")
    return lines


def write(args: argparse.Namespace, job: str, log_dir: Path, tasks: list[Task], minutes: int | None) -> tuple[str, dict]:
    """Every variant's config and plan and the manifest; returns the array script and the predictions."""
    log_dir.mkdir(parents=True, exist_ok=True)
    predictions = {}
    for t in tasks:
        prediction = predictions[t.variant] = job_prediction(t.side.built)
        files = JobFiles(log_dir, f"{job}.{slug(t.variant)}")
        export.write_yaml(t.side.built.cfg, files.config)
        write_spec(t.spec, files.spec)
        plan = {**plan_json(args, t.side, minutes, prediction), "variant": t.variant, "array_task": t.index,
                "baseline_config": str(log_dir / f"{job}.off.config.yaml")}
        files.plan.write_text(json.dumps(strict_json(plan), indent=2, allow_nan=False, default=str) + "\n")
    (log_dir / MANIFEST).write_text(json.dumps(manifest(args, job, tasks), indent=2) + "\n")
    return render_array(args, job, log_dir, tasks), predictions

