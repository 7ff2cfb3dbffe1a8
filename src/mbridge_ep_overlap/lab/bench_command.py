"""``mbridge-ep-overlap bench``: the command that runs the benchmark (``tools.bench``) or, with
``--tune``, the knob search (``tools.tune``); it sits above both, so neither imports the other
back. Contract: the flags are checked before anything runs (tune-only flags without ``--tune``
are bad usage, one line); exit 0 when every job ran (or was skipped saying why), 1 otherwise.
"""

from __future__ import annotations

from pathlib import Path

from ..base.choices import MEASURED_DISPATCHERS
from ..base.errors import UsageError
from .bench import SHAPES, VARIANTS, parse_variants, report, run_bench
from ..runtime.exits import positive_int
from .tune import load_tuned_variant, tune_links


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="A/B benchmark of EP-overlap variants (GPU node, torchrun)")
    p.add_argument("--recipe", default="qwen3_moe_proxy")
    p.add_argument("--nproc", type=positive_int, default=2)
    p.add_argument("--variants", default="off,overlap", help=f"comma list of {', '.join(VARIANTS)} (and tuned)")
    p.add_argument("--links", default=None, help="comma list of nvlink, throttled (default: both; --tune: throttled)")
    p.add_argument("--steps", type=positive_int, default=None, help="default 12 (--tune: 8)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", type=int, default=2, help="profiled steps at the end (excluded from timing)")
    p.add_argument("--shape", default="default", choices=sorted(SHAPES), help="benchmark shape (bench.SHAPES)")
    p.add_argument("--comm-bound", action="store_true", help="same as --shape comm-bound")
    p.add_argument("--out", default=None, help="output folder (default out/bench; --tune: out/tune)")
    p.add_argument("--report", nargs="+", metavar="DIR", help="run nothing: merge these bench output folders into --out")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="--report: predict the steps of a launch_slurm.py --variants folder with this cluster "
                        "calibration (written by calibrate)")
    p.add_argument("--tuned", default=None, metavar="TUNED_JSON",
                   help="adds the variant 'tuned': the settings a --tune run wrote (tuned.json)")
    t = p.add_argument_group("tuning (--tune: tools/tune.py)")
    t.add_argument("--tune", action="store_true",
                   help="search the overlap knobs (off + overlap, then one knob at a time on the best) within --budget")
    t.add_argument("--budget", type=positive_int, default=None, metavar="SECONDS",
                   help="--tune: wall-clock budget of this invocation (runs are estimated from the previous ones)")
    t.add_argument("--dispatcher", default=None, choices=MEASURED_DISPATCHERS,
                   help="--tune: the overlapped dispatcher to tune (default alltoall)")
    t.add_argument("--mem-tolerance", type=float, default=None,
                   help="--tune: peak memory allowed above the overlap baseline's, as a fraction (default 0.02)")
    t.add_argument("--min-gain", type=float, default=None,
                   help="--tune: a knob is kept when it is at least this fraction faster (default 0.005)")
    p.add_argument("extra", nargs="*", help="run_script flags / key=value overrides for every variant (after --)")
    p.set_defaults(handler=_main)


def _main(args) -> int:
    shape = "comm-bound" if args.comm_bound else args.shape
    if not args.tune:
        given = [flag for flag, value in (("--budget", args.budget), ("--dispatcher", args.dispatcher),
                                          ("--mem-tolerance", args.mem_tolerance), ("--min-gain", args.min_gain))
                 if value is not None]
        if given:
            raise UsageError("tune-only flags", " ".join(given), "only with --tune (a plain bench names its "
                             "dispatchers in --variants, e.g. --variants off,overlap,hybridep)", "unused")
    if args.calibration is not None and not args.report:
        raise UsageError("--calibration", args.calibration, "only with --report (it predicts the steps of a "
                         "launch_slurm.py --variants folder)", "unused")
    if args.report:
        results = report([Path(d) for d in args.report], Path(args.out or "out/bench"),
                         f"{args.recipe}: {', '.join(args.report)}", calibration=args.calibration)
        return 0 if results else 1
    if args.tune:
        if args.budget is None:
            raise UsageError("--budget", None, "--tune needs a wall-clock budget in seconds (--budget SECONDS)", "missing")
        links = (args.links or "throttled").split(",")
        outcomes = tune_links(args.recipe, args.nproc, shape, links, Path(args.out or "out/tune"), args.budget,
                              steps=args.steps or 8, warmup=args.warmup, profile=args.profile, extra=args.extra,
                              **{k: v for k, v in (("dispatcher", args.dispatcher), ("mem_tolerance", args.mem_tolerance),
                                                   ("min_gain", args.min_gain)) if v is not None})  # else tune's defaults
        return 0 if all(o.winner is not None for o in outcomes) else 1
    extra_variants = {"tuned": load_tuned_variant(Path(args.tuned))} if args.tuned else None
    known = {**VARIANTS, **(extra_variants or {})}
    results = run_bench(args.recipe, args.nproc, parse_variants(args.variants, known), (args.links or "nvlink,throttled").split(","),
                        Path(args.out or "out/bench"), args.steps or 12, args.warmup, args.profile, args.extra,
                        shape=shape, extra_variants=extra_variants)
    return 0 if all(r.ok or r.error.startswith("skipped") for r in results) else 1
