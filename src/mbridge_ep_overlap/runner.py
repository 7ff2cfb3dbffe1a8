"""``scripts/run_script.py``: recipe-level flags a user of MB's performance scripts recognises.

Contract
--------
``main(argv)`` builds a registered recipe, applies the flags, turns EP overlap on or *really*
off, applies trailing Hydra-style ``key=value`` overrides (with MB's own override machinery),
then either

* ``--dryrun``: runs MB's ``runtime_config_update`` for the described cluster (``--gpu``,
  ``--num-gpus``; hardware faked, nothing else), prints the finalized EP-overlap fields one per
  line as ``name: value``, writes the resolved YAML and prints its path; or
* trains: MB's ``pretrain()`` with MB's GPT forward step (which accepts
  ``return_schedule_plan``), wrapped by ``evidence.ScheduleProbe`` and recorded by
  ``evidence.RunRecorder`` (``--summary-json``).

Exit codes: 0 ok; 1 refused config (``EPOverlapError``, every violation printed); 2 bad usage
(one line, no traceback: unknown flag, bad value, unknown recipe, malformed override).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .dispatcher import DISPATCHERS
from .environment import GPU_CATALOG
from .errors import OneLineArgumentParser, UsageError, run_reporting_errors


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="run_script.py", description="Train or dry-run an EP-overlap recipe with Megatron-Bridge.")
    p.add_argument("--recipe", required=True, help="registered recipe name (see `mbridge-ep-overlap recipes`)")
    p.add_argument("--ep-overlap", choices=("on", "off"), default="on")
    p.add_argument("--dispatcher", choices=DISPATCHERS, default=None, help="default: the recipe's")
    p.add_argument("--delay-wgrad", choices=("on", "off"), default="off")
    p.add_argument("--a2a-priority", choices=("default", "high"), default="default",
                   help="CUDA priority of the all-to-all stream of the overlapped schedule")
    p.add_argument("--resolve", choices=("error", "auto"), default="error")
    p.add_argument("--tp", type=int, dest="tensor_model_parallel_size")
    p.add_argument("--pp", type=int, dest="pipeline_model_parallel_size")
    p.add_argument("--vpp", type=int, dest="virtual_pipeline_model_parallel_size")
    p.add_argument("--cp", type=int, dest="context_parallel_size")
    p.add_argument("--ep", type=int, dest="expert_model_parallel_size")
    p.add_argument("--etp", type=int, dest="expert_tensor_parallel_size")
    p.add_argument("--global-batch-size", type=int)
    p.add_argument("--micro-batch-size", type=int)
    p.add_argument("--seq-length", type=int)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--force-balance", action="store_true", help="moe_router_force_load_balancing (benchmarks)")
    p.add_argument("--gpu", choices=sorted(GPU_CATALOG), help="--dryrun: target GPU (default: the recipe's)")
    p.add_argument("--num-gpus", type=int, help="--dryrun: target world size (default: the recipe's)")
    p.add_argument("--dryrun", action="store_true", help="finalize and write the resolved YAML; no training")
    p.add_argument("--output-dir", default="out/run_script", help="where the YAML / summary go")
    p.add_argument("--summary-json", default=None, help="training: write the evidence summary here")
    p.add_argument("--profile-steps", default=None, metavar="A:B",
                   help="training: profile CUDA kernels from step A to B (overlap efficiency in the summary)")
    p.add_argument("overrides", nargs="*", help="Hydra-style key=value overrides, applied last")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    for token in unknown:
        if token.startswith("-"):
            parser.error(f"unrecognized argument {token!r}")
        args.overrides.append(token)
    if args.profile_steps is not None:
        a, sep, b = args.profile_steps.partition(":")
        if not (sep and a.isdigit() and b.isdigit() and int(a) < int(b)):
            parser.error(f"--profile-steps must be A:B with A < B, got {args.profile_steps!r}")
        args.profile_steps = (int(a), int(b))
    for item in args.overrides:
        if "=" not in item or item.startswith("=") or item.startswith("-"):
            parser.error(f"malformed override {item!r}; expected key=value (e.g. train.train_iters=10)")
    for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                 "expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size",
                 "global_batch_size", "micro_batch_size", "seq_length", "max_steps", "num_gpus"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return args


def apply_flags(cfg: Any, args: argparse.Namespace) -> None:
    m = cfg.model
    for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                 "expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size"):
        value = getattr(args, name)
        if value is not None:
            setattr(m, name, value)
    if args.global_batch_size:
        cfg.train.global_batch_size = args.global_batch_size
    if args.micro_batch_size:
        cfg.train.micro_batch_size = args.micro_batch_size
    if args.seq_length:
        m.seq_length = args.seq_length
        cfg.dataset.seq_length = args.seq_length
    if args.max_steps:
        cfg.train.train_iters = args.max_steps
    if args.force_balance:
        m.moe_router_force_load_balancing = True


def apply_overrides(cfg: Any, overrides: list[str]) -> None:
    if not overrides:
        return
    from megatron.bridge.training.utils.omegaconf_utils import OverridesError, process_config_with_overrides

    try:
        process_config_with_overrides(cfg, cli_overrides=list(overrides))
    except OverridesError as e:
        raise UsageError("override", " ".join(overrides), str(e).splitlines()[0]) from None


def prepare(args: argparse.Namespace, environment=None):
    """Build the config for ``args``. Returns (cfg, plan or None, environment)."""
    from .enable import disable_ep_overlap, enable_ep_overlap
    from .environment import describe, probe
    from .recipe import get_recipe

    for flag, value, neutral in (("--delay-wgrad", args.delay_wgrad, "off"), ("--a2a-priority", args.a2a_priority, "default")):
        if args.ep_overlap == "off" and value != neutral:  # would be silently meaningless
            raise UsageError(flag, value, f"{neutral!r} while --ep-overlap is off")
    recipe = get_recipe(args.recipe)
    cfg = recipe.base()
    apply_flags(cfg, args)
    if environment is None:
        if args.dryrun:
            environment = describe(args.gpu or recipe.info.gpu, args.num_gpus or recipe.info.num_gpus)
        else:
            environment = probe()
    plan = None
    if args.ep_overlap == "on":
        plan = enable_ep_overlap(
            cfg,
            args.dispatcher or recipe.info.dispatcher,
            delay_wgrad=args.delay_wgrad == "on",
            high_priority_a2a=args.a2a_priority == "high",
            resolve=args.resolve,
            environment=environment,
        )
    else:
        disable_ep_overlap(cfg)
        if args.dispatcher and args.dispatcher != "alltoall":
            from .dispatcher import apply_flex

            apply_flex(cfg.model, args.dispatcher, environment)
    apply_overrides(cfg, args.overrides)
    return cfg, plan, environment


def dryrun(cfg: Any, environment, args: argparse.Namespace) -> int:
    from .dryrun import finalize_for

    result = finalize_for(cfg, environment)
    for path, old, new in result.te_adaptations:
        old, new = (getattr(v, "__name__", v) if callable(v) else v for v in (old, new))
        print(f"# no Transformer Engine on this machine: {path} {old!r} -> {new!r} for this dry run only")
    for line in result.lines():
        print(line)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    yaml_path = out / f"{args.recipe}.yaml"
    cfg.to_yaml(str(yaml_path))
    print(f"config: {yaml_path}")
    return 0


def train(cfg: Any, args: argparse.Namespace) -> int:
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    from .check import evaluate
    from .evidence import RunRecorder, ScheduleProbe

    probe = ScheduleProbe().install()
    step = probe.wrap_forward_step(forward_step)
    evaluate(cfg, forward_step_func=step).raise_for_errors("run_script")
    summary = args.summary_json or os.path.join(args.output_dir, f"{args.recipe}.summary.json")
    meta = {"recipe": args.recipe, "ep_overlap": args.ep_overlap, "dispatcher_flag": args.dispatcher,
            "delay_wgrad": args.delay_wgrad, "overrides": args.overrides}
    pretrain(cfg, step, callbacks=[RunRecorder(summary, probe, meta, profile_steps=args.profile_steps)])
    probe.uninstall()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def run() -> int:
        cfg, plan, environment = prepare(args)
        if plan is not None and int(os.environ.get("RANK", "0")) == 0:
            print(plan.to_table())
        return dryrun(cfg, environment, args) if args.dryrun else train(cfg, args)

    return run_reporting_errors("run_script.py", run)
