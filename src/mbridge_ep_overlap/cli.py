"""Command line: ``mbridge-ep-overlap`` / ``python -m mbridge_ep_overlap``.

Contract
--------
* ``doctor``: this machine in a block a user can paste into an issue (versions, GPUs, NCCL,
  NVSHMEM, the relevant environment variables, active import shims), then a verdict per
  dispatcher. Exit 0.
* ``plan``: build a recipe (default ``qwen3_moe_proxy``), apply ``--set key=value`` edits, call
  ``enable_ep_overlap`` for the described cluster, run MB's real finalize with only the hardware
  faked, print the plan and the rule table (or ``--json``). Exit 0 when accepted, 1 when refused
  (every violation printed). Works on a CPU machine without TE or hub access.
* ``recipes``: list the registered recipes.
* ``bench`` / ``verify-log``: the evidence tools (see their modules).
Bad input: one line naming the bad value and the allowed ones, exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from typing import Any

from .dispatcher import DISPATCHERS
from .environment import GPU_CATALOG
from .errors import EPOverlapError, OneLineArgumentParser, UpstreamRefusal, UsageError, run_reporting_errors

DEFAULT_RECIPE = "qwen3_moe_proxy"


def _parse_sets(items: list[str]) -> list[str]:
    for item in items:
        key, sep, _ = item.partition("=")
        if not sep or not key or not all(p.isidentifier() for p in key.split(".")):
            raise UsageError("--set value", item, "key=value with a dotted field path, e.g. model.mtp_num_layers=1")
    return items


# ---- doctor -----------------------------------------------------------------------------------
def doctor_lines() -> list[str]:
    import torch

    from .dispatcher import DISPATCHERS, choose, usable_here
    from .environment import probe
    from .import_shims import installed

    env = probe()
    lines = ["mbridge-ep-overlap doctor", "```"]
    lines.append(f"python            : {platform.python_version()} ({sys.executable})")
    lines.append(f"torch             : {torch.__version__} (CUDA {torch.version.cuda})")
    lines.append(f"megatron-core     : {env.mcore_version or 'missing'}")
    lines.append(f"megatron-bridge   : {env.mb_version or 'missing'}")
    lines.append(f"transformer-engine: {env.te_version or 'missing'}")
    lines.append(f"deep_ep           : {env.deep_ep_version or 'missing'}"
                 + (f" (HybridEP: {'yes' if env.hybrid_ep_available else 'no'})" if env.deep_ep_version else ""))
    if env.deep_ep_build:
        lines.append(f"deep_ep build     : {env.deep_ep_build}")
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        p = torch.cuda.get_device_properties(0)
        lines.append(f"GPUs              : {n} x {p.name} (sm{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)")
        try:
            lines.append(f"NCCL              : {'.'.join(map(str, torch.cuda.nccl.version()))}")
        except Exception as e:  # pragma: no cover - depends on the build
            lines.append(f"NCCL              : unknown ({e})")
    else:
        lines.append("GPUs              : none visible (CUDA not available)")
    from .environment import dist_version

    lines.append(f"NVSHMEM           : {dist_version('nvidia-nvshmem-cu13', 'nvidia-nvshmem-cu12') or 'missing'}")
    shims = installed()
    lines.append(f"import shims      : {', '.join(shims) if shims else 'none (real packages present)'}")
    for k in sorted(env.env_vars):
        lines.append(f"env {k}={env.env_vars[k]}")
    if "CUDA_DEVICE_MAX_CONNECTIONS" not in env.env_vars:
        lines.append("env CUDA_DEVICE_MAX_CONNECTIONS unset (CUDA default 8; enable_ep_overlap puts 32 in cfg.env_vars)")
    gap = dataset_helpers_gap()
    lines.append(f"dataset helpers   : {'OK' if gap is None else 'PROBLEM: ' + gap}")
    lines.append("```")
    lines.append("dispatchers for EP overlap on this machine:")
    for d in DISPATCHERS[:-1]:
        ok, why = usable_here(d, env)
        lines.append(f"  {d:9s} {'usable' if ok else 'NOT usable'}: {why}")
    ep = max(env.gpus_per_node or 1, 2)
    auto = choose("auto", env, ep)
    lines.append(f"  auto      -> {auto.dispatcher} at EP={ep} ({auto.reason})")
    return lines


# ---- plan -------------------------------------------------------------------------------------
def run_plan(args: argparse.Namespace) -> int:
    from .check import evaluate
    from .dryrun import finalize_for, plain
    from .enable import enable_ep_overlap
    from .environment import describe
    from .recipe import get_recipe
    from .runner import apply_overrides

    recipe = get_recipe(args.recipe)
    env = describe(args.gpu or recipe.info.gpu, args.num_gpus or recipe.info.num_gpus)
    cfg = recipe.base()
    apply_overrides(cfg, _parse_sets(args.set))
    out: dict[str, Any] = {"recipe": args.recipe, "environment": env.to_dict()}
    try:
        plan = enable_ep_overlap(
            cfg, args.dispatcher or recipe.info.dispatcher, delay_wgrad=args.delay_wgrad, resolve=args.resolve,
            environment=env,
        )
        out["plan"] = plan.to_dict()
        result = finalize_for(cfg, env)
        out["finalized"] = plain(result.summary)
        out["te_adaptations_for_this_dry_run"] = [p for p, _, _ in result.te_adaptations]
        report = evaluate(cfg, env)
        out["accepted"] = True
    except (EPOverlapError, UpstreamRefusal) as e:
        out.update(accepted=False, violations=[v.to_dict() for v in getattr(e, "violations", [])], error=str(e))
        if args.json:
            print(json.dumps(out, indent=2))
        else:
            print(f"{args.recipe} on {env.source}: REFUSED\n{e}")
        return 1
    if args.json:
        out["rules"] = [dict(zip(("rule", "status", "detail"), row)) for row in report.status_rows()]
        print(json.dumps(out, indent=2))
        return 0
    print(plan.to_table())
    print("\nfinalized by Megatron-Bridge (runtime_config_update, hardware faked):")
    for line in result.lines():
        print(f"  {line}")
    if result.te_adaptations:
        print("  (no Transformer Engine here: for this dry run only, switched off "
              + ", ".join(p for p, _, _ in result.te_adaptations) + ")")
    print("\nrules:")
    width = max(len(r[0]) for r in report.status_rows())
    for rule_id, status, detail in report.status_rows():
        print(f"  {rule_id:{width}s}  {status:11s}  {detail}")
    print(f"\n{args.recipe} on {env.source}: ACCEPTED with EP overlap on")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="mbridge-ep-overlap", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineArgumentParser)
    sub.add_parser("doctor", help="print this machine's EP-overlap environment and verdicts")
    sub.add_parser("recipes", help="list the registered recipes")
    pl = sub.add_parser("plan", help="plan and finalize a recipe with EP overlap for a described cluster")
    pl.add_argument("--recipe", default=DEFAULT_RECIPE)
    pl.add_argument("--dispatcher", choices=DISPATCHERS, default=None)
    pl.add_argument("--gpu", choices=sorted(GPU_CATALOG), default=None)
    pl.add_argument("--num-gpus", type=int, default=None)
    pl.add_argument("--delay-wgrad", action="store_true")
    pl.add_argument("--resolve", choices=("error", "auto"), default="error")
    pl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pl.add_argument("--json", action="store_true")
    from . import bench, logs

    bench.add_parser(sub)
    logs.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return run_reporting_errors("mbridge-ep-overlap", lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "doctor":
        print("\n".join(doctor_lines()))
        return 0
    if args.command == "recipes":
        from .recipe import load_recipes

        for name, r in sorted(load_recipes().items()):
            i = r.info
            print(f"{name:24s} {i.num_gpus:5d}x {i.gpu:6s} {i.dispatcher:9s} {i.summary}")
        return 0
    if args.command == "plan":
        if args.num_gpus is not None and args.num_gpus < 1:
            raise UsageError("--num-gpus", args.num_gpus, "a positive integer")
        return run_plan(args)
    return args.handler(args)


def dataset_helpers_gap() -> str | None:
    """MB's initialize runs ``make -C megatron/core/datasets``; the PyPI wheel has no Makefile there."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("megatron.core.datasets")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    if (folder / "Makefile").exists():
        return None
    prebuilt = any(folder.glob("helpers_cpp*.so"))
    return (
        f"{folder}/Makefile is missing: MB pretrain() exits at 'compiling dataset index builder'. Fix: "
        + (f"printf 'default:\\n\\t@true\\n' > {folder}/Makefile  (helpers_cpp is prebuilt)" if prebuilt
           else "install megatron-core from source, or build helpers_cpp")
    )
