"""The text of a Slurm job this project writes: where its files go (``JobFiles``), its ``#SBATCH``
header, the exported environment, the rendezvous and the ``srun`` -> ``torchrun`` ->
``scripts/run_script.py`` line (``render`` for one job; ``tools.slurm_variants`` for an array), and
the plan JSON written beside it; the job runs ``run_script.py --spec <job>.spec.json``
(``runtime.spec_file``: the run description as data, never flags to re-parse). Every value reaching the script is quoted or validated
(``tools.slurm_values``); nothing here submits or builds.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from dataclasses import dataclass
from pathlib import Path

from .slurm_values import sbatch_value


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
    def spec(self) -> Path:
        """The run description the job's ``run_script.py --spec`` reads (``runtime.spec_file``)."""
        return self.path(".spec.json")

    @property
    def baseline_spec(self) -> Path:
        return self.path(".baseline.spec.json")

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


def header(args: argparse.Namespace, job: str, log_dir: Path, *, output: str = "%x-%j.out",
           extra: tuple[str, ...] = ()) -> list[str]:
    """The ``#!`` line and the ``#SBATCH`` lines of a job (``extra``: more of them, e.g. ``--array``)."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={sbatch_value('--job-name', job)}",
        f"#SBATCH --nodes={args.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={args.gpus_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={sbatch_value('--time', args.time)}",
        f"#SBATCH --output={sbatch_value('--log-dir', str(log_dir))}/{output}",
        *extra,
    ]
    if args.partition is not None:
        lines.append(f"#SBATCH --partition={sbatch_value('--partition', args.partition)}")
    if args.account is not None:
        lines.append(f"#SBATCH --account={sbatch_value('--account', args.account)}")
    return lines


def export_lines(env_vars: dict[str, str], overridden: dict[str, str], indent: str = "") -> list[str]:
    """The plan's and the recipe's variables, exported (and what the multicast-off ones replaced)."""
    q = shlex.quote
    lines = [f"{indent}# the recipe asked {name}={q(value)}; NVLink multicast stays off (--nvlink-multicast on keeps it)"
             for name, value in sorted(overridden.items())]
    return lines + [f"{indent}export {name}={q(value)}" for name, value in sorted(env_vars.items())]


ENV_COMMENT = [
    "# Environment required by the EP-overlap plan and the recipe (cfg.env_vars), exported",
    "# before any process starts: CUDA reads CUDA_DEVICE_MAX_CONNECTIONS at initialisation.",
]
RENDEZVOUS = [
    'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    "export MASTER_PORT=${MASTER_PORT:-29500}",
]


def launch_line(args: argparse.Namespace, run_args: list[str], torchrun_extra: tuple[str, ...] = ()) -> str:
    """``srun`` -> ``torchrun`` (c10d rendezvous) -> ``scripts/run_script.py RUN_ARGS`` (``run_args``
    already shell words: ``--spec FILE`` and what is per task)."""
    q = shlex.quote
    srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if args.container_image:
        srun.append(q(f"--container-image={args.container_image}"))
    if args.container_mounts:
        srun.append(q(f"--container-mounts={args.container_mounts}"))
    torchrun = [
        "torchrun", "--nnodes", "$SLURM_NNODES", "--nproc_per_node", str(args.gpus_per_node),
        "--rdzv_id", "$SLURM_JOB_ID", "--rdzv_backend", "c10d", "--rdzv_endpoint", "$MASTER_ADDR:$MASTER_PORT",
        *torchrun_extra, "scripts/run_script.py", *run_args,
    ]
    return " \\\n  ".join([" ".join(srun), " ".join(torchrun)])


def render(args: argparse.Namespace, run_argv: list[str], env_vars: dict[str, str], overridden: dict[str, str],
           files: JobFiles, *, baseline: bool = False) -> str:
    q = shlex.quote
    lines = header(args, files.job + ("-baseline" if baseline else ""), files.log_dir)
    config = files.baseline_config if baseline else files.config
    lines += ["set -euo pipefail", f"echo {q(f'config (finalized, plain Megatron-Bridge YAML): {config}')}"]
    if baseline:
        lines.append(f"echo {q(f'this is the EP-overlap-off baseline of {files.script}')}")
    else:
        lines += [f"echo {q(f'baseline config (EP overlap off): {files.baseline_config}')}",
                  f"echo {q(f'plan: {files.plan}')}",
                  f"echo {q(f'rollback (EP overlap off): {files.rollback()}')}"]
    lines += [f"cd {q(args.workdir)}", "", *ENV_COMMENT, *export_lines(env_vars, overridden), "", *RENDEZVOUS, ""]
    lines.append(launch_line(args, [q(a) for a in run_argv]))
    return "\n".join(lines) + "\n"


def job_prediction(built) -> dict:
    from ..core.prediction import CannotPredict, for_config

    try:
        return for_config(built.cfg, built.target).to_dict()
    except CannotPredict as e:
        return {"error": e.reason}


def plan_json(args: argparse.Namespace, run, minutes: int | None, prediction: dict) -> dict:
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
