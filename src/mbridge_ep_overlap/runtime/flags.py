"""Command-line flags of a ``RunSpec``, declared once for every front end.

Contract: ``add_spec_arguments(parser)`` adds the run-description flags (recipe, overlap,
dispatcher, delayed wgrad, all-to-all priority, resolve, parallel and batch sizes, target,
overrides) to any parser - with ``spec_file=True`` also ``--spec FILE``, the whole description read
from a file (``runtime.spec_file``: what a launched job is given); ``parse(parser, argv)`` parses them
(trailing ``key=value`` tokens are overrides, an unknown ``--flag`` is an error; ``--spec`` with any
run-description flag is an error naming the flag: the file describes the whole run, nothing is
merged); ``spec_from_args(ns)`` maps the result onto a ``RunSpec`` (an unknown recipe name refused
there, before Megatron is imported; with ``--spec`` the file's spec, whose target a training run
replaces by this machine). No torch or Megatron import.
"""

from __future__ import annotations

import argparse

from ..base.choices import A2A_PRIORITIES, DISPATCHERS, ON_OFF, RESOLVE_MODES, canonical_dispatcher
from ..base.errors import UsageError
from ..spec import RunSpec, TargetSpec, resolve_recipe
from ..base.gpus import GPU_CATALOG, canonical_gpu
from .exits import positive_int
from .spec_file import read_spec

# flag -> RunSpec field, for the parallel and batch sizes
SIZE_FLAGS = {
    "--tp": "tensor_model_parallel_size", "--pp": "pipeline_model_parallel_size",
    "--vpp": "virtual_pipeline_model_parallel_size", "--cp": "context_parallel_size",
    "--ep": "expert_model_parallel_size", "--etp": "expert_tensor_parallel_size",
    "--global-batch-size": "global_batch_size", "--micro-batch-size": "micro_batch_size",
    "--seq-length": "seq_length", "--max-steps": "max_steps",
}
# RunSpec field -> the flag that sets it, to name the flag when the spec refuses a value
FIELD_FLAGS = {**{name: flag for flag, name in SIZE_FLAGS.items()}, "delay_wgrad": "--delay-wgrad",
               "high_priority_a2a": "--a2a-priority", "dispatcher": "--dispatcher", "resolve": "--resolve",
               "number of GPUs": "--num-gpus", "te version": "--te", "deep_ep version": "--deep-ep",
               "hf_config_dir": "--hf-config-dir", "exported environment": "--env"}


SPEC_FLAG = "--spec"
_RUN_DESCRIPTION = "_run_description_actions"  # the parser attribute listing the flags --spec replaces


def add_spec_arguments(parser: argparse.ArgumentParser, *, recipe_default: str | None = None,
                       spec_file: bool = False) -> None:
    g = parser.add_argument_group("run description (RunSpec)")
    g.add_argument("--recipe", required=recipe_default is None and not spec_file, default=recipe_default,
                   help="registered recipe name (`mbridge-ep-overlap recipes`) or MODULE:FUNCTION")
    if spec_file:
        g.add_argument(SPEC_FLAG, default=None, metavar="FILE",
                       help="the whole run description from a spec file (launch_slurm.py and bench write one per "
                            "job); no other run-description flag with it")
    g.add_argument("--ep-overlap", choices=ON_OFF, default="on", help="off really turns a recipe's overlap off")
    g.add_argument("--dispatcher", type=canonical_dispatcher, choices=DISPATCHERS, default=None, help="default: the recipe's")
    g.add_argument("--delay-wgrad", choices=ON_OFF, nargs="?", const="on", default=None,
                   help="delayed weight-gradient compute (needs TE); default: the recipe's")
    g.add_argument("--a2a-priority", choices=A2A_PRIORITIES, default=None,
                   help="CUDA priority of the overlapped schedule's all-to-all stream; default: the recipe's")
    g.add_argument("--resolve", choices=RESOLVE_MODES, default="error",
                   help="auto: apply each refused rule's documented fix and record it")
    for flag, name in SIZE_FLAGS.items():
        g.add_argument(flag, type=positive_int, dest=name, metavar="N")
    g.add_argument("--force-balance", action="store_true", help="moe_router_force_load_balancing (benchmarks)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="set_overrides",
                   help="Hydra-style override (same as a trailing key=value)")
    g.add_argument("--hf-config-dir", default=None, metavar="DIR",
                   help="architecture files <org>--<model>/config.json not shipped with the package")
    t = parser.add_argument_group("target cluster (dry runs, plans, Slurm jobs)")
    t.add_argument("--gpu", type=canonical_gpu, choices=sorted(GPU_CATALOG), default=None, help="default: the recipe's")
    t.add_argument("--num-gpus", type=positive_int, default=None, metavar="N", help="default: the recipe's")
    t.add_argument("--te", default=None, metavar="VERSION|none",
                   help="Transformer Engine on the target (default: the reference stack of MB 0.6.2)")
    t.add_argument("--deep-ep", default=None, metavar="VERSION|none", help="DeepEP on the target (default: unknown)")
    t.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", dest="exported_env",
                   help="a variable the job's launcher exports (repeatable): it wins over cfg.env_vars, so the "
                        "plan judges it")
    setattr(parser, _RUN_DESCRIPTION, [a for a in (*g._group_actions, *t._group_actions) if a.dest != "spec"])
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print every warning the libraries raise as they wrote it (same as EP_OVERLAP_VERBOSE=1)")
    parser.add_argument("overrides", nargs="*", help="Hydra-style key=value overrides, applied last")


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    args, unknown = parser.parse_known_args(argv)
    for token in unknown:
        if token.startswith("-"):
            parser.error(f"unrecognized argument {token!r}")
        args.overrides.append(token)
    for item in args.overrides:
        if "=" not in item or item.startswith(("=", "-")):
            parser.error(f"malformed override {item!r}; expected key=value (e.g. train.train_iters=10)")
    if getattr(args, "spec", None) is not None:
        given = [a.option_strings[0] for a in getattr(parser, _RUN_DESCRIPTION, ())
                 if getattr(args, a.dest) != a.default]
        given += ["key=value override"] if args.overrides else []
        if given:
            parser.error(f"{SPEC_FLAG} FILE describes the whole run; drop {', '.join(given)} (or drop {SPEC_FLAG} "
                         "and give every flag)")
    elif hasattr(args, "spec") and args.recipe is None:
        parser.error(f"the following arguments are required: --recipe (or {SPEC_FLAG} FILE)")
    return args


def spec_from_args(args: argparse.Namespace, *, this_machine: bool = False, num_gpus: int | None = None) -> RunSpec:
    """The validated spec; a registered recipe name is resolved here, before any front end imports
    Megatron, so a misspelt one is refused in a fraction of a second."""
    if getattr(args, "spec", None) is not None:
        spec = read_spec(args.spec)
        return spec.replace(target=TargetSpec(this_machine=True)).validated() if this_machine else spec
    try:
        spec = _spec(args, this_machine, num_gpus)
        if ":" not in spec.recipe:
            resolve_recipe(spec.recipe)
        return spec
    except UsageError as e:
        if e.what not in FIELD_FLAGS:
            raise
        raise UsageError(f"{e.what} ({FIELD_FLAGS[e.what]})", e.value, e.allowed, e.problem) from None


def _spec(args: argparse.Namespace, this_machine: bool, num_gpus: int | None) -> RunSpec:
    priority = None if args.a2a_priority is None else A2A_PRIORITIES[args.a2a_priority]
    return RunSpec(
        recipe=args.recipe,
        ep_overlap=ON_OFF[args.ep_overlap],
        dispatcher=args.dispatcher,
        delay_wgrad=None if args.delay_wgrad is None else ON_OFF[args.delay_wgrad],
        high_priority_a2a=priority,
        resolve=args.resolve,
        force_balance=args.force_balance,
        overrides=tuple([*args.set_overrides, *args.overrides]),
        hf_config_dir=args.hf_config_dir,
        target=TargetSpec(this_machine=this_machine, gpu=args.gpu, num_gpus=num_gpus or args.num_gpus,
                          te=args.te, deep_ep=args.deep_ep, env=tuple(getattr(args, "exported_env", ()))),
        **{name: getattr(args, name) for name in SIZE_FLAGS.values()},
    ).validated()
