"""Multi-node launch: an ``sbatch`` job script that runs a recipe with the plan's environment.

Contract
--------
``main(argv)`` (``scripts/launch_slurm.py``) maps its flags onto the same ``RunSpec`` as
``run_script.py`` (``tools.flags``), builds it for ``--nodes x --gpus-per-node`` GPUs of ``--gpu``
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
* runs ``srun`` -> ``torchrun`` (one launcher per node, c10d rendezvous) -> ``scripts/run_script.py``
  with the spec's flags (``flags.to_argv``).

Beside it, in ``--log-dir``, dry run or not (``JobFiles``): ``<job>.config.yaml`` and
``<job>.baseline.yaml``, the finalized config of the run and of the same run with EP overlap off, as
YAML plain Megatron-Bridge loads (``core.export``); ``<job>.plan.json`` (spec, plan, finalized fields,
prediction, job size); ``<job>.baseline.sbatch``, and the rollback command ``sbatch
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
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import UsageError
from .exits import OneLineArgumentParser, positive_int, run_reporting_errors, stdout_to_stderr
from .flags import add_spec_arguments, parse, spec_from_args, to_argv
from . import plan_report
from .launch import MULTICAST_OFF, launch_environment
from .slurm_values import format_minutes, job_environment, sbatch_value, time_limit_minutes

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
    s.add_argument("--output", default=None, help="where to write the job script (default: <log-dir>/<job>.sbatch)")
    s.add_argument("--dryrun", action="store_true", help="print the job script (and write its files), submit nothing")
    s.add_argument("--yes", action="store_true", help="submit without asking (scripts)")
    return p


@dataclass(frozen=True)
class JobFiles:
    """Where a job's files go: everything in the log folder, named after the job."""

    log_dir: Path
    job: str

    def path(self, suffix: str) -> Path:
        return self.log_dir / f"{self.job}{suffix}"

    @property
    def config(self) -> Path:
        return self.path(".config.yaml")

    @property
    def baseline_config(self) -> Path:
        return self.path(".baseline.yaml")

    @property
    def plan(self) -> Path:
        return self.path(".plan.json")

    @property
    def script(self) -> Path:
        return self.path(".sbatch")

    @property
    def baseline_script(self) -> Path:
        return self.path(".baseline.sbatch")

    def rollback(self) -> str:
        return f"sbatch {shlex.quote(str(self.baseline_script))}"


def job_name(args: argparse.Namespace) -> str:
    return args.job_name or f"ep-overlap-{args.recipe.replace(':', '.')}"


def render(args: argparse.Namespace, run_argv: list[str], env_vars: dict[str, str], overridden: dict[str, str],
           files: JobFiles, *, baseline: bool = False) -> str:
    q = shlex.quote
    job = files.job + ("-baseline" if baseline else "")
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={sbatch_value('--job-name', job)}",
        f"#SBATCH --nodes={args.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={args.gpus_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={sbatch_value('--time', args.time)}",
        f"#SBATCH --output={sbatch_value('--log-dir', str(files.log_dir))}/%x-%j.out",
    ]
    if args.partition is not None:
        lines.append(f"#SBATCH --partition={sbatch_value('--partition', args.partition)}")
    if args.account is not None:
        lines.append(f"#SBATCH --account={sbatch_value('--account', args.account)}")
    config = files.baseline_config if baseline else files.config
    lines += ["set -euo pipefail", f"echo {q(f'config (finalized, plain Megatron-Bridge YAML): {config}')}"]
    if baseline:
        lines.append(f"echo {q(f'this is the EP-overlap-off baseline of {files.script}')}")
    else:
        lines += [f"echo {q(f'baseline config (EP overlap off): {files.baseline_config}')}",
                  f"echo {q(f'plan: {files.plan}')}",
                  f"echo {q(f'rollback (EP overlap off): {files.rollback()}')}"]
    lines += [
        f"cd {q(args.workdir)}",
        "",
        "# Environment required by the EP-overlap plan and the recipe (cfg.env_vars), exported",
        "# before any process starts: CUDA reads CUDA_DEVICE_MAX_CONNECTIONS at initialisation.",
    ]
    lines += [f"# the recipe asked {name}={q(value)}; NVLink multicast stays off (--nvlink-multicast on keeps it)"
              for name, value in sorted(overridden.items())]
    lines += [f"export {name}={q(value)}" for name, value in sorted(env_vars.items())]
    lines += [
        "",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=${MASTER_PORT:-29500}",
        "",
    ]
    srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if args.container_image:
        srun.append(q(f"--container-image={args.container_image}"))
    if args.container_mounts:
        srun.append(q(f"--container-mounts={args.container_mounts}"))
    torchrun = [
        "torchrun", "--nnodes", "$SLURM_NNODES", "--nproc_per_node", str(args.gpus_per_node),
        "--rdzv_id", "$SLURM_JOB_ID", "--rdzv_backend", "c10d", "--rdzv_endpoint", "$MASTER_ADDR:$MASTER_PORT",
        "scripts/run_script.py", *(q(a) for a in run_argv),
    ]
    lines.append(" \\\n  ".join([" ".join(srun), " ".join(torchrun)]))
    return "\n".join(lines) + "\n"


def _check_job_size(args: argparse.Namespace) -> None:
    """``--gpus-per-node`` defaults to what a node of the target GPU kind holds (``target.gpus``) and
    cannot exceed it; ``--num-gpus`` (the run flag), when given, must equal ``--nodes x
    --gpus-per-node`` - the job's size, which the run is built for."""
    from ..spec import resolve_recipe
    from ..target.gpus import GPU_CATALOG

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


def _prediction(built) -> dict:
    from ..predict.config import CannotPredict, for_config

    try:
        return for_config(built.cfg, built.target).to_dict()
    except CannotPredict as e:
        return {"error": e.reason}


def _plan_json(args: argparse.Namespace, run: _Side, minutes: int | None, prediction: dict) -> dict:
    import dataclasses

    cfg = run.built.cfg
    return {
        "recipe": run.spec.recipe,
        "spec": dataclasses.asdict(run.spec),
        "plan": run.built.plan.to_dict() if run.built.plan else None,
        "finalized": run.finalized,
        "prediction": prediction,
        "job": {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "time": args.time,
                "time_limit_minutes": minutes, "partition": args.partition, "account": args.account,
                "train_iters": getattr(cfg.train, "train_iters", None)},
    }


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
    """Write the configs, plan and baseline job; return the job script."""
    from ..core import export
    from .plan_command import strict_json

    files.log_dir.mkdir(parents=True, exist_ok=True)
    export.write_yaml(run.built.cfg, files.config)
    export.write_yaml(base.built.cfg, files.baseline_config)
    files.plan.write_text(json.dumps(strict_json(_plan_json(args, run, minutes, prediction)), indent=2,
                                     allow_nan=False, default=str) + "\n")
    files.baseline_script.write_text(render(args, to_argv(base.spec), base.env_vars, base.overridden, files,
                                            baseline=True))
    return render(args, to_argv(run.spec), run.env_vars, run.overridden, files)


def _emit(args: argparse.Namespace) -> int:
    _check_job_size(args)
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
    if not args.dryrun:  # before the build: a cluster that is not there, or refuses the request, says so at once
        test = _sbatch(["--test-only", *_request(args), "--wrap", "true"], "nothing was written")
    outcome = plan_report.for_job(spec)  # plan's build, finalize and report: what plan refuses is refused here
    run = _side(spec, outcome.built, outcome.data["finalized"], args)
    with stdout_to_stderr():
        base = _build_side(spec.replace(ep_overlap=False), args) if spec.ep_overlap else run
        prediction = _prediction(run.built)
        script = plan_report.into_script(_write(files, args, run, base, minutes, prediction), outcome)
    written = f"configs, plan and baseline job in {files.log_dir}; rollback: {files.rollback()}"
    if args.dryrun:
        print(script, end="", flush=True)
        print(f"launch_slurm.py: {written}", file=sys.stderr, flush=True)
        return 0
    path = Path(args.output) if args.output else files.script
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    where = f"the job script is {path}"
    steps = getattr(run.built.cfg.train, "train_iters", None)
    print(f"job {path} takes:", *cost_lines(args, minutes, steps, prediction), sep="\n")
    slurm_says = (test.stderr.strip().splitlines() or [""])[-1]
    print(f"  Slurm says     : {slurm_says.removeprefix('sbatch: ')}", f"  {written}", sep="\n", flush=True)
    if not _confirm(args):
        print(f"not submitted; {where}", flush=True)
        return 0
    job_id = _sbatch(["--parsable", str(path)], where).stdout.strip().split(";")[0]
    print(f"submitted job {job_id}: output {files.log_dir}/{files.job}-{job_id}.out", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), sys.argv[1:] if argv is None else argv)
    return run_reporting_errors("launch_slurm.py", lambda: _emit(args), hold_stderr=not args.verbose)
