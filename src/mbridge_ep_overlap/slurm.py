"""Multi-node launch: an ``sbatch`` job script that runs a recipe with the plan's environment.

Contract
--------
``main(argv)`` (``scripts/launch_slurm.py``) builds the recipe exactly as ``run_script.py`` will
on the cluster (same flags, same ``enable_ep_overlap`` call, for ``--nodes x --gpus-per-node``
GPUs of ``--gpu``), refuses a config the rules refuse (exit 1, every violation printed), and
renders a job script that

* requests the nodes / GPUs (partition, account, time, container only when given);
* **exports every variable of ``cfg.env_vars``** - ``CUDA_DEVICE_MAX_CONNECTIONS`` and HybridEP's
  NVLink-domain variables from the plan, the recipe's NCCL settings - before any process starts
  (CUDA reads them at initialisation; MB's own ``setdefault`` would be too late for some), plus
  NVLink-multicast-off and rendezvous variables;
* runs ``srun`` -> ``torchrun`` (one launcher per node, c10d rendezvous) -> ``scripts/run_script.py``
  with the same flags and overrides.

``--dryrun`` prints the script (``scripts/launch_slurm.py`` keeps stdout for the script alone:
Megatron's own logging goes to stderr); otherwise it is written to ``--output`` and submitted with
``sbatch`` (a clear error when ``sbatch`` is not on PATH). Exit 2 for bad usage.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from .dispatcher import DISPATCHERS
from .environment import GPU_CATALOG, describe
from .errors import OneLineArgumentParser, run_reporting_errors

# Always exported: NVLink multicast off (shared hosts) unless the plan says otherwise.
ALWAYS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="launch_slurm.py", description="Render (and submit) an sbatch job for an EP-overlap recipe.")
    p.add_argument("--recipe", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gpu", choices=sorted(GPU_CATALOG), default=None, help="default: the recipe's")
    p.add_argument("--ep-overlap", choices=("on", "off"), default="on")
    p.add_argument("--dispatcher", choices=DISPATCHERS, default=None)
    p.add_argument("--delay-wgrad", choices=("on", "off"), default="off")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--time", default="01:00:00")
    p.add_argument("--job-name", default=None)
    p.add_argument("--container-image", default=None, help="pyxis/enroot image (srun --container-image)")
    p.add_argument("--container-mounts", default=None)
    p.add_argument("--workdir", default=".", help="checkout path on the cluster (where scripts/run_script.py is)")
    p.add_argument("--log-dir", default="logs")
    p.add_argument("--output", default=None, help="where to write the job script (default: <log-dir>/<job>.sbatch)")
    p.add_argument("--dryrun", action="store_true", help="print the job script, submit nothing")
    p.add_argument("run_args", nargs="*", help="more run_script.py flags / key=value overrides")
    return p


def _run_script_args(args: argparse.Namespace, extra: list[str]) -> list[str]:
    out = ["--recipe", args.recipe, "--ep-overlap", args.ep_overlap, "--delay-wgrad", args.delay_wgrad]
    if args.dispatcher:
        out += ["--dispatcher", args.dispatcher]
    return out + extra


def plan_environment(args: argparse.Namespace, extra: list[str]) -> dict[str, str]:
    """Build the config the job will build, on the described cluster; return its env vars."""
    from .recipe import get_recipe
    from .runner import parse_args, prepare

    recipe = get_recipe(args.recipe)
    world = args.nodes * args.gpus_per_node
    env = describe(args.gpu or recipe.info.gpu, world)
    run_args = parse_args([*_run_script_args(args, extra), "--num-gpus", str(world)])
    cfg, _, _ = prepare(run_args, environment=env)
    from .check import evaluate

    evaluate(cfg, env).raise_for_errors("launch_slurm")
    return {k: str(int(v) if isinstance(v, bool) else v) for k, v in (cfg.env_vars or {}).items()}


def render(args: argparse.Namespace, env_vars: dict[str, str], extra: list[str]) -> str:
    job = args.job_name or f"ep-overlap-{args.recipe}"
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job}",
        f"#SBATCH --nodes={args.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={args.gpus_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={args.time}",
        f"#SBATCH --output={args.log_dir}/%x-%j.out",
    ]
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        lines.append(f"#SBATCH --account={args.account}")
    lines += [
        "set -euo pipefail",
        f"cd {shlex.quote(args.workdir)}",
        "",
        "# Environment required by the EP-overlap plan and the recipe (cfg.env_vars), exported",
        "# before any process starts: CUDA reads CUDA_DEVICE_MAX_CONNECTIONS at initialisation.",
    ]
    for name, value in sorted({**ALWAYS, **env_vars}.items()):
        lines.append(f"export {name}={shlex.quote(value)}")
    lines += [
        "",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=${MASTER_PORT:-29500}",
        "",
    ]
    srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if args.container_image:
        srun.append(f"--container-image={args.container_image}")
    if args.container_mounts:
        srun.append(f"--container-mounts={args.container_mounts}")
    torchrun = [
        "torchrun", "--nnodes", "$SLURM_NNODES", "--nproc_per_node", str(args.gpus_per_node),
        "--rdzv_id", "$SLURM_JOB_ID", "--rdzv_backend", "c10d", "--rdzv_endpoint", "$MASTER_ADDR:$MASTER_PORT",
        "scripts/run_script.py", *(shlex.quote(a) for a in _run_script_args(args, extra)),
    ]
    lines.append(" \\\n  ".join([" ".join(srun), " ".join(torchrun)]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, script_out=None) -> int:
    """``script_out``: where ``--dryrun`` prints the job script (default ``sys.stdout``)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    extra = [*unknown, *args.run_args]
    if args.nodes < 1 or args.gpus_per_node < 1:
        parser.error("--nodes and --gpus-per-node must be >= 1")
    return run_reporting_errors("launch_slurm.py", lambda: _emit(args, extra, script_out))


def _emit(args: argparse.Namespace, extra: list[str], script_out) -> int:
    script = render(args, plan_environment(args, extra), extra)
    if args.dryrun:
        print(script, end="", file=script_out or sys.stdout, flush=True)
        return 0
    path = Path(args.output or Path(args.log_dir) / f"{args.job_name or 'ep-overlap-' + args.recipe}.sbatch")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    if shutil.which("sbatch") is None:
        print(f"launch_slurm.py: error: sbatch not found on PATH; job script written to {path}", file=sys.stderr)
        return 2
    return subprocess.run(["sbatch", str(path)]).returncode
