"""Multi-node launch: an ``sbatch`` job script that runs a recipe with the plan's environment.

Contract
--------
``main(argv)`` (``scripts/launch_slurm.py``) maps its flags onto the same ``RunSpec`` as
``run_script.py`` (``runtime.flags``), builds it for ``--nodes x --gpus-per-node`` GPUs of ``--gpu``
(``pipeline.build``: the config the job will build), refuses what ``plan`` refuses - a config the rules
refuse, or MB's own finalize for that cluster (exit 1, every violation printed) - and renders a job
script that

* requests the nodes / GPUs (partition, account, time, container only when given), its Slurm output
  in ``--log-dir`` (an absolute path: slurmd opens it before the script runs, so the folder is made
  here, when the job is written - a job whose output folder is missing fails with nothing in it);
* first prints the files that keep the way back (below), then **exports every variable of
  ``cfg.env_vars``** - ``CUDA_DEVICE_MAX_CONNECTIONS`` and HybridEP's NVLink-domain variables from the
  plan, the recipe's NCCL settings - before any process starts, plus the NVLink-multicast-off
  variables (``launch.MULTICAST_OFF``, which win over a recipe's value unless ``--nvlink-multicast
  on``), every ``--env KEY=VALUE`` (exported last, so in force) and the rendezvous variables; the plan
  is judged with the multicast-off and ``--env`` values as the job will have them;
* runs ``srun`` -> ``torchrun`` (one launcher per node, c10d rendezvous) -> ``scripts/run_script.py
  --spec <log-dir>/<job>.spec.json``: the run description as data (``runtime.spec_file``), read and
  checked by every rank as flags would be; the job's node is the target (probed there).

Beside it, in ``--log-dir``, dry run or not (``JobFiles``): ``<job>.config.yaml`` and
``<job>.baseline.yaml``, the finalized config of the run and of the same run with EP overlap off, as
YAML plain Megatron-Bridge loads (``core.export``); ``<job>.plan.json`` (spec, plan, finalized fields,
prediction, job size); ``<job>.spec.json`` and ``<job>.baseline.spec.json``, the run descriptions the
two jobs run; ``<job>.baseline.sbatch``, and the rollback command ``sbatch
<log-dir>/<job>.baseline.sbatch``. Every value that reaches a shell line is shell-quoted; an
``#SBATCH`` value is checked by ``slurm_values`` (one plain word; ``--time`` as Slurm reads it), so no
input can start a script line of its own or be silently cut short.

``--dryrun`` prints the script on stdout (Megatron's logging goes to stderr) and submits nothing.
Otherwise, before anything is built, the job's request is put to the cluster (``sbatch --test-only``:
a missing ``sbatch``, a controller that does not answer or a request the cluster refuses is exit 2
in one line); then the script is written to ``--output`` (default ``<log-dir>/<job>.sbatch``), what
the job takes is printed (``cost_lines``: nodes x GPUs, time limit, GPU-hours, partition, account,
predicted step time and time for the steps) and it is submitted only on confirmation: ``--yes``, or
``y`` at the prompt. Without ``--yes`` in a shell that cannot ask (stdin not a terminal) it is exit
2 before anything is built.

``--variants off,overlap,...`` writes one job array instead, task i running variant i
(``slurm_variants``: every variant judged first, a refused one refuses all; its own files and
``bench report`` layout); ``header``, ``export_lines`` and ``launch_line`` are the parts both
scripts share.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import UsageError
from ..runtime.exits import OneLineArgumentParser, positive_int, run_reporting_errors, stdout_to_stderr
from ..runtime.flags import add_spec_arguments, parse, spec_from_args
from . import plan_report
from ..lab.launch import MULTICAST_OFF, launch_environment
from . import slurm_variants
from .slurm_script import (ENV_COMMENT, RENDEZVOUS, JobFiles, export_lines, header, job_name,  # noqa: F401 - the
                           launch_line, job_prediction, plan_json, render)  # job script's parts, re-exported
from .slurm_values import format_minutes, job_environment, sbatch_value, time_limit_minutes
from ..runtime.spec_file import write_spec

SBATCH_TIMEOUT_S = 60
"""How long sbatch may take to answer (it retries an unreachable controller for about that long)."""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="launch_slurm.py", description="Render (and submit) an sbatch job for an EP-overlap recipe.")
    add_spec_arguments(p)
    s = p.add_argument_group("Slurm job")
    s.add_argument("--nodes", type=positive_int, required=True, metavar="N")
    s.add_argument("--gpus-per-node", type=positive_int, default=None, metavar="N",
                   help="default: what a node of the target GPU kind holds (8; 4 on GB200/GB300/VR200)")
    s.add_argument("--partition")
    s.add_argument("--account")
    s.add_argument("--time", default="01:00:00", help="Slurm time limit (default 01:00:00)")
    s.add_argument("--job-name", default=None)
    s.add_argument("--container-image", default=None, help="pyxis/enroot image (srun --container-image)")
    s.add_argument("--container-mounts", default=None)
    s.add_argument("--workdir", default=".", help="checkout path on the cluster (where scripts/run_script.py is)")
    s.add_argument("--log-dir", default="logs", help="Slurm output, the configs, plan and baseline job (made here)")
    s.add_argument("--nvlink-multicast", choices=("off", "on"), default="off",
                   help="off (default): export the multicast-off variables, winning over the recipe's")
    s.add_argument("--variants", default=None, metavar="LIST",
                   help="A/B on the cluster: one job array, task i runs variant i of this comma list of bench's "
                        "variants (off, overlap, ...; off is added first when missing); bench report reads its folder")
    s.add_argument("--output", default=None, help="where to write the job script (default: <log-dir>/<job>.sbatch)")
    s.add_argument("--dryrun", action="store_true", help="print the job script (and write its files), submit nothing")
    s.add_argument("--yes", action="store_true", help="submit without asking (scripts)")
    return p


def _check_job_size(args: argparse.Namespace) -> None:
    """``--gpus-per-node`` defaults to what a node of the target GPU kind holds (``base.gpus``) and
    cannot exceed it; ``--num-gpus`` (the run flag), when given, must equal ``--nodes x
    --gpus-per-node`` - the job's size, which the run is built for."""
    from ..spec import resolve_recipe
    from ..base.gpus import GPU_CATALOG

    gpu = args.gpu or resolve_recipe(args.recipe).entry.gpu
    kind = GPU_CATALOG.get(str(gpu).lower()) if gpu else None
    if args.gpus_per_node is None:
        args.gpus_per_node = kind.gpus_per_node if kind else 8
    elif kind is not None and args.gpus_per_node > kind.gpus_per_node:
        raise UsageError("--gpus-per-node", args.gpus_per_node,
                         f"at most {kind.gpus_per_node} ({kind.key} nodes hold {kind.gpus_per_node} GPUs)", "invalid")
    world = args.nodes * args.gpus_per_node
    if args.num_gpus is not None and args.num_gpus != world:
        raise UsageError("--num-gpus", args.num_gpus, f"{world} (--nodes {args.nodes} x --gpus-per-node "
                         f"{args.gpus_per_node}), or leave --num-gpus out", "inconsistent")


@dataclass
class _Side:
    """One of the two jobs written: the run or its overlap-off baseline, built and finalized."""

    spec: object
    built: object
    finalized: dict
    """The finalized fields (``finalize(built).summary``)."""
    env_vars: dict[str, str]
    overridden: dict[str, str]


def _side(spec, built, finalized: dict, args: argparse.Namespace) -> _Side:
    recipe_env = job_environment(built.cfg)
    env_vars = launch_environment(recipe_env) if args.nvlink_multicast == "off" else recipe_env
    overridden = {k: v for k, v in recipe_env.items() if env_vars.get(k) != v}
    env_vars = {**env_vars, **spec.target.exported()}  # --env: exported last, so in force (and judged)
    return _Side(spec, built, finalized, env_vars, overridden)


def _build_side(spec, args: argparse.Namespace) -> _Side:
    from ..pipeline import build, finalize

    built = build(spec)
    return _side(spec, built, finalize(built).summary, args)  # MB's own finalize for the job's cluster


def cost_lines(args: argparse.Namespace, minutes: int | None, steps: int | None, prediction: dict) -> list[str]:
    """What the job takes, as printed before asking: size, limit, GPU-hours, where, predicted time."""
    gpus = args.nodes * args.gpus_per_node
    hours = "unbounded (UNLIMITED: the partition's own limit applies)" if minutes is None \
        else f"at most {gpus * minutes / 60:.1f} GPU-hours ({gpus} GPUs x {format_minutes(minutes)})"
    lines = [f"  nodes x GPUs   : {args.nodes} x {args.gpus_per_node} = {gpus} GPUs",
             f"  time limit     : {format_minutes(minutes)}",
             f"  GPU-hours      : {hours}",
             f"  partition      : {args.partition or '(the cluster default)'}",
             f"  account        : {args.account or '(your default)'}"]
    if "error" in prediction:
        lines.append(f"  predicted step : not made ({prediction['error']})")
        return lines
    p = prediction.get("prediction", prediction)
    on, off = p.get("on_step_s"), p.get("off_step_s")
    step = on if args.ep_overlap == "on" else off
    lines.append(f"  predicted step : {step:.3f} s with EP overlap {args.ep_overlap} (off: {off:.3f} s; step-time model)")
    if steps:
        total = step * steps
        within = "" if minutes is None or total <= minutes * 60 else " - MORE than the time limit"
        lines.append(f"  {steps} steps     : {total / 60:.1f} min predicted (start-up not included){within}")
    return lines


def _sbatch(argv: list[str], what: str) -> subprocess.CompletedProcess:
    """sbatch, its failure as one line (exit 2): not on PATH, no controller, a request refused."""
    if shutil.which("sbatch") is None:
        raise UsageError("sbatch", None, f"sbatch on PATH (a Slurm login node); {what}", "missing")
    try:
        result = subprocess.run(["sbatch", *argv], capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UsageError("answer from sbatch", f"none in {SBATCH_TIMEOUT_S} s", f"a Slurm controller that answers; {what}",
                         "no") from None
    if result.returncode != 0:
        said = " ".join((result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1].split())
        raise UsageError("sbatch", said, f"a request the cluster accepts; {what}", "refused by")
    return result


def _request(args: argparse.Namespace) -> list[str]:
    """The job's request as sbatch flags (the #SBATCH lines' values), for asking the cluster first."""
    out = [f"--nodes={args.nodes}", "--ntasks-per-node=1", f"--gpus-per-node={args.gpus_per_node}", "--exclusive",
           f"--time={args.time}"]
    out += [f"--{flag}={value}" for flag, value in (("partition", args.partition), ("account", args.account)) if value]
    return out


def _confirm(args: argparse.Namespace) -> bool:
    if args.yes:
        return True
    print("submit? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _write(files: JobFiles, args: argparse.Namespace, run: _Side, base: _Side, minutes: int | None,
           prediction: dict) -> str:
    """Write the configs, plan, spec files and baseline job; return the job script."""
    from ..core import export
    from .plan import strict_json

    files.log_dir.mkdir(parents=True, exist_ok=True)
    export.write_yaml(run.built.cfg, files.config)
    export.write_yaml(base.built.cfg, files.baseline_config)
    files.plan.write_text(json.dumps(strict_json(plan_json(args, run, minutes, prediction)), indent=2,
                                     allow_nan=False, default=str) + "\n")
    files.baseline_script.write_text(render(args, write_spec(base.spec, files.baseline_spec), base.env_vars,
                                            base.overridden, files, baseline=True))
    return render(args, write_spec(run.spec, files.spec), run.env_vars, run.overridden, files)


def _emit(args: argparse.Namespace) -> int:
    _check_job_size(args)
    names = None
    if args.variants is not None:  # before the 10-s build: bad variants or flags a variant sets
        names = slurm_variants.variant_names(args)
    for flag in ("--job-name", "--log-dir", "--partition", "--account"):  # before the 10-s build
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            sbatch_value(flag, value)
    minutes = time_limit_minutes(args.time)
    if not (args.dryrun or args.yes or (sys.stdin is not None and sys.stdin.isatty())):
        raise UsageError("--yes", None, "this shell cannot ask before submitting (stdin is not a terminal): "
                         "pass --yes to submit, or --dryrun to write the job only", "missing")
    spec = spec_from_args(args, num_gpus=args.nodes * args.gpus_per_node)  # the recipe named well, first
    if args.nvlink_multicast == "off":  # the job exports these: the plan judges the environment it will have
        spec = spec.replace(target=spec.target.replace(env=(*(f"{k}={v}" for k, v in MULTICAST_OFF.items()),
                                                            *spec.target.env)))
    files = JobFiles(Path(args.log_dir).absolute(), sbatch_value("--job-name", job_name(args)))
    test = None
    if not args.dryrun:  # before the build: a cluster that is not there, or refuses the request, says so at once
        array = [f"--array=0-{len(names) - 1}"] if names else []
        test = _sbatch(["--test-only", *_request(args), *array, "--wrap", "true"], "nothing was written")
    if names:
        return _emit_array(args, spec, names, files, minutes, test)
    outcome = plan_report.for_job(spec)  # plan's build, finalize and report: what plan refuses is refused here
    run = _side(spec, outcome.built, outcome.data["finalized"], args)
    with stdout_to_stderr():
        base = _build_side(spec.replace(ep_overlap=False), args) if spec.ep_overlap else run
        prediction = job_prediction(run.built)
        script = plan_report.into_script(_write(files, args, run, base, minutes, prediction), outcome)
    written = f"configs, plan and baseline job in {files.log_dir}; rollback: {files.rollback()}"
    steps = getattr(run.built.cfg.train, "train_iters", None)
    return _submit(args, files, script, written, test, cost_lines(args, minutes, steps, prediction))


def _emit_array(args: argparse.Namespace, spec, names: list[str], files: JobFiles, minutes: int | None,
                test) -> int:
    """``--variants``: one job array, task i runs variant i (``slurm_variants``)."""
    tasks = slurm_variants.plan_tasks(spec, names)  # every variant judged first; a refused one refuses all
    for t in tasks:
        t.side = _side(t.spec, t.outcome.built, t.outcome.data["finalized"], args)
    with stdout_to_stderr():
        script, predictions = slurm_variants.write(args, files.job, files.log_dir, tasks, minutes)
    files.script.write_text(script)  # in the run folder, dry run too: the rollback submits it
    path = Path(args.output) if args.output else files.script
    written = (f"configs, plans and {slurm_variants.MANIFEST} in {files.log_dir}; runs in {files.log_dir}/runs; "
               f"rollback (the overlap-off task alone): {slurm_variants.rollback(path)}")
    steps = getattr(tasks[0].side.built.cfg.train, "train_iters", None)
    return _submit(args, files, script, written, test,
                   slurm_variants.cost_lines(args, minutes, tasks, predictions, steps), array=True)


def _submit(args: argparse.Namespace, files: JobFiles, script: str, written: str, test, costs: list[str],
            array: bool = False) -> int:
    """Print the script (``--dryrun``), or write it, show what it takes and submit on confirmation."""
    if args.dryrun:
        print(script, end="", flush=True)
        print(f"launch_slurm.py: {written}", file=sys.stderr, flush=True)
        return 0
    path = Path(args.output) if args.output else files.script
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    where = f"the job script is {path}"
    print(f"job {'array ' if array else ''}{path} takes:", *costs, sep="\n")
    slurm_says = (test.stderr.strip().splitlines() or [""])[-1]
    print(f"  Slurm says     : {slurm_says.removeprefix('sbatch: ')}", f"  {written}", sep="\n", flush=True)
    if not _confirm(args):
        print(f"not submitted; {where}", flush=True)
        return 0
    job_id = _sbatch(["--parsable", str(path)], where).stdout.strip().split(";")[0]
    output = f"{files.log_dir}/{files.job}-{job_id}_<task>.out" if array else f"{files.log_dir}/{files.job}-{job_id}.out"
    print(f"submitted job {job_id}: output {output}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), sys.argv[1:] if argv is None else argv)
    return run_reporting_errors("launch_slurm.py", lambda: _emit(args), hold_stderr=not args.verbose)
