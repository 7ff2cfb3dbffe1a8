"""Multi-node launch: an ``sbatch`` job script that runs a recipe with the plan's environment.

Contract
--------
``main(argv)`` (``scripts/launch_slurm.py``) maps its flags onto the same ``RunSpec`` as
``run_script.py`` (``tools.flags``), builds it for ``--nodes x --gpus-per-node`` GPUs of ``--gpu``
(``pipeline.build``: the config the job will build), refuses what ``plan`` refuses - a config the rules
refuse, or MB's own finalize for that cluster (exit 1, every violation printed) - and renders a job
script that

* requests the nodes / GPUs (partition, account, time, container only when given);
* **exports every variable of ``cfg.env_vars``** - ``CUDA_DEVICE_MAX_CONNECTIONS`` and HybridEP's
  NVLink-domain variables from the plan, the recipe's NCCL settings - before any process starts,
  plus the NVLink-multicast-off variables (``launch.MULTICAST_OFF``, which win over a recipe's
  value unless ``--nvlink-multicast on``) and the rendezvous variables;
* runs ``srun`` -> ``torchrun`` (one launcher per node, c10d rendezvous) -> ``scripts/run_script.py``
  with the spec's flags (``flags.to_argv``).

Every value that reaches a shell line is shell-quoted; an ``#SBATCH`` value (which sbatch reads
up to the first blank and does not unquote like a shell) with a blank, quote, backslash, newline or
NUL, a ``--time`` that is not a Slurm time, or a variable name that is not an identifier is bad
usage (exit 2), so no input can start a script line of its own or be silently cut short. ``--dryrun`` prints the script on stdout (Megatron's logging
goes to stderr); otherwise it is written to ``--output`` and submitted with ``sbatch``.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from ..core.errors import UsageError
from ..core.values import env_value
from .exits import OneLineArgumentParser, positive_int, run_reporting_errors
from .flags import add_spec_arguments, parse, spec_from_args, to_argv
from . import plan_report
from .launch import launch_environment

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="launch_slurm.py", description="Render (and submit) an sbatch job for an EP-overlap recipe.")
    add_spec_arguments(p)
    s = p.add_argument_group("Slurm job")
    s.add_argument("--nodes", type=positive_int, required=True, metavar="N")
    s.add_argument("--gpus-per-node", type=positive_int, default=None, metavar="N",
                   help="default: what a node of the target GPU kind holds (8; 4 on GB200/GB300/VR200)")
    s.add_argument("--partition")
    s.add_argument("--account")
    s.add_argument("--time", default="01:00:00")
    s.add_argument("--job-name", default=None)
    s.add_argument("--container-image", default=None, help="pyxis/enroot image (srun --container-image)")
    s.add_argument("--container-mounts", default=None)
    s.add_argument("--workdir", default=".", help="checkout path on the cluster (where scripts/run_script.py is)")
    s.add_argument("--log-dir", default="logs")
    s.add_argument("--nvlink-multicast", choices=("off", "on"), default="off",
                   help="off (default): export the multicast-off variables, winning over the recipe's")
    s.add_argument("--output", default=None, help="where to write the job script (default: <log-dir>/<job>.sbatch)")
    s.add_argument("--dryrun", action="store_true", help="print the job script, submit nothing")
    return p


# sbatch reads an #SBATCH line up to the first blank, so a value with a blank (or a quote, which
# sbatch's own parser treats specially) would silently be cut short there.
_SBATCH_UNSAFE = set(" \t\n\r\0\v\f'\"\\")
# Slurm's --time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds; or UNLIMITED / INFINITE.
_SLURM_TIME = re.compile(r"[0-9]+(:[0-9]{1,2}){0,2}|[0-9]+-[0-9]{1,2}(:[0-9]{1,2}){0,2}|UNLIMITED|INFINITE",
                         re.IGNORECASE)


def _sbatch_value(flag: str, value: str) -> str:
    if not value or any(c in _SBATCH_UNSAFE for c in value):
        raise UsageError(flag, value, "a non-empty value without blanks, quotes, backslashes, newlines or NUL "
                         "(sbatch cuts an #SBATCH value at the first blank)", "invalid")
    if flag == "--time" and not _SLURM_TIME.fullmatch(value):
        raise UsageError(flag, value, "a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED",
                         "invalid")
    return value


def job_environment(cfg) -> dict[str, str]:
    """``cfg.env_vars`` as the job exports them. Its values were judged by the rule table
    (``env-var-values``: str, a number or a bool) before this runs; a name a shell cannot export is
    bad usage."""
    env = {str(k): env_value(v) for k, v in (cfg.env_vars or {}).items()}
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise UsageError("environment variable name", name, "letters, digits and _ (not starting with a digit)",
                             "invalid")
    return env


def render(args: argparse.Namespace, run_argv: list[str], env_vars: dict[str, str], overridden: dict[str, str]) -> str:
    job = args.job_name or f"ep-overlap-{args.recipe.replace(':', '.')}"
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={_sbatch_value('--job-name', job)}",
        f"#SBATCH --nodes={args.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={args.gpus_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={_sbatch_value('--time', args.time)}",
        f"#SBATCH --output={_sbatch_value('--log-dir', args.log_dir)}/%x-%j.out",
    ]
    if args.partition is not None:
        lines.append(f"#SBATCH --partition={_sbatch_value('--partition', args.partition)}")
    if args.account is not None:
        lines.append(f"#SBATCH --account={_sbatch_value('--account', args.account)}")
    lines += [
        "set -euo pipefail",
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


def _emit(args: argparse.Namespace) -> int:
    _check_job_size(args)
    for flag in ("--job-name", "--time", "--log-dir", "--partition", "--account"):  # before the 10-s build
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            _sbatch_value(flag, value)
    spec = spec_from_args(args, num_gpus=args.nodes * args.gpus_per_node)
    outcome = plan_report.for_job(spec)  # plan's build, finalize and report: what plan refuses is refused here
    built = outcome.built
    recipe_env = job_environment(built.cfg)
    env_vars = launch_environment(recipe_env) if args.nvlink_multicast == "off" else recipe_env
    overridden = {k: v for k, v in recipe_env.items() if env_vars.get(k) != v}
    script = plan_report.into_script(render(args, to_argv(spec), env_vars, overridden), outcome)
    if args.dryrun:
        print(script, end="", flush=True)
        return 0
    path = Path(args.output or Path(args.log_dir) / f"{args.job_name or 'ep-overlap-' + args.recipe.replace(':', '.')}.sbatch")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    if shutil.which("sbatch") is None:
        raise UsageError("sbatch", None, f"sbatch on PATH (a Slurm login node); the job script is written to {path}",
                         "missing")
    return subprocess.run(["sbatch", str(path)]).returncode


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), sys.argv[1:] if argv is None else argv)
    return run_reporting_errors("launch_slurm.py", lambda: _emit(args), hold_stderr=not args.verbose)
