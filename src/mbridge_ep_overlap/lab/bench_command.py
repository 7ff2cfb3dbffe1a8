"""``mbridge-ep-overlap bench run|report|tune``: the measurement lab's command.

Contract
--------
* ``bench run``: the A/B benchmark of the variants (``lab.bench``); exit 0 when every job ran (or
  was skipped saying why), 1 otherwise.
* ``bench report DIR...``: run nothing; merge bench output folders (or a ``launch_slurm.py
  --variants`` folder, predicted with ``--calibration FILE`` when given) into ``--out``; exit 0 with
  rows, 1 without.
* ``bench tune``: the knob search within ``--budget`` (``lab.tune``); exit 0 when every link found a
  winner, 1 otherwise.

Each flag exists only on the subcommand it acts on, checked before anything runs. The old spellings
(``bench --report``, ``bench --tune``, ``bench`` with the flags of ``bench run``) are bad usage: one
line naming the new spelling, exit 2. This module sits above ``bench`` and ``tune``, so neither
imports the other back.
"""

from __future__ import annotations

from pathlib import Path

from ..base.choices import MEASURED_DISPATCHERS
from ..base.errors import UsageError
from ..runtime.exits import positive_int
from .bench import SHAPES, VARIANTS, parse_variants, report, run_bench
from .tune import load_tuned_variant, tune_links

_NEW_SPELLING = {
    "--report": "bench report DIR... [--calibration FILE]",
    "--calibration": "bench report DIR... --calibration FILE",
    "--tune": "bench tune --budget SECONDS",
    "--budget": "bench tune --budget SECONDS",
    "--dispatcher": "bench tune --dispatcher NAME",
    "--mem-tolerance": "bench tune --mem-tolerance FRACTION",
    "--min-gain": "bench tune --min-gain FRACTION",
}
"""A flag of the one-level ``bench`` -> the subcommand that has it now (the others: ``bench run``)."""


def _moved_flag(args: list[str], flags) -> str | None:
    """The first of ``flags`` among the options of ``args`` (before ``--``), else None."""
    options = args[:args.index("--")] if "--" in args else args
    return next((a.split("=", 1)[0] for a in options if a.split("=", 1)[0] in flags), None)


def _moved_bench(args: list[str]) -> str | None:
    """``bench`` followed by a flag (not ``--help``): the spelling before the subcommands."""
    if not args or not args[0].startswith("-") or args[0] in ("-h", "--help"):
        return None
    flag = _moved_flag(args, ("--report", "--tune")) or _moved_flag(args, _NEW_SPELLING) or args[0]
    return (f"`bench {flag}` is now `mbridge-ep-overlap {_NEW_SPELLING.get(flag, 'bench run ' + flag + ' ...')}` "
            "(bench run|report|tune)")


_ELSEWHERE = {
    "run": {"--report": "report", "--calibration": "report", "--tune": "tune", "--budget": "tune",
            "--dispatcher": "tune", "--mem-tolerance": "tune", "--min-gain": "tune"},
    "tune": {"--report": "report", "--calibration": "report", "--variants": "run", "--tuned": "run"},
}
"""For ``bench run`` / ``bench tune``: a flag of another subcommand -> that subcommand."""


def _moved_within(command: str):
    """``bench run`` / ``bench tune`` given a flag of another subcommand: one line naming it."""
    def check(args: list[str]) -> str | None:
        if command == "tune" and _moved_flag(args, ("--tune",)):
            return "`bench tune --tune`: `bench tune` is the knob search, drop --tune"
        flag = _moved_flag(args, _ELSEWHERE[command])
        return (f"`bench {command} {flag}`: {flag} is a flag of `mbridge-ep-overlap bench {_ELSEWHERE[command][flag]}`"
                if flag else None)
    return check


def _workload(p, command: str, steps: int, links: str, out: str) -> None:
    """The flags ``bench run`` and ``bench tune`` share: what is launched, on what, and where it goes."""
    p.add_argument("--recipe", default="qwen3_moe_proxy")
    p.add_argument("--nproc", type=positive_int, default=2)
    p.add_argument("--links", default=links, help=f"comma list of nvlink, throttled (default: {links})")
    p.add_argument("--steps", type=positive_int, default=steps, help=f"timed steps per run (default {steps})")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", type=int, default=2, help="profiled steps at the end (excluded from timing)")
    p.add_argument("--shape", default="default", choices=sorted(SHAPES), help="benchmark shape (bench.SHAPES)")
    p.add_argument("--comm-bound", action="store_true", help="same as --shape comm-bound")
    p.add_argument("--out", default=out, help=f"output folder (default {out})")
    p.add_argument("extra", nargs="*", help="run_script flags / key=value overrides for every run (after --)")
    p.moved = _moved_within(command)


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="A/B benchmark of EP-overlap variants (GPU node, torchrun): run, report, tune")
    p.moved = _moved_bench
    bench = p.add_subparsers(dest="bench_command", required=True, metavar="{run,report,tune}",
                             parser_class=type(p))

    r = bench.add_parser("run", help="run the variants on each link and compare them (GPU node, torchrun)")
    _workload(r, "run", steps=12, links="nvlink,throttled", out="out/bench")
    r.add_argument("--variants", default="off,overlap", help=f"comma list of {', '.join(VARIANTS)} (and tuned)")
    r.add_argument("--tuned", default=None, metavar="TUNED_JSON",
                   help="adds the variant 'tuned': the settings a `bench tune` run wrote (tuned.json)")
    r.set_defaults(handler=_run)

    m = bench.add_parser("report", help="run nothing: merge bench output folders into one table and plot")
    m.add_argument("folders", nargs="+", metavar="DIR", help="bench output folders, or a launch_slurm.py --variants folder")
    m.add_argument("--out", default="out/bench", help="output folder (default out/bench)")
    m.add_argument("--recipe", default="qwen3_moe_proxy", help="the recipe named in the report's title")
    m.add_argument("--calibration", default=None, metavar="FILE",
                   help="predict the steps of a launch_slurm.py --variants folder with this cluster calibration "
                        "(written by calibrate)")
    m.set_defaults(handler=_report)

    t = bench.add_parser("tune", help="search the overlap knobs (off + overlap, then one knob at a time on the best) "
                                      "within --budget (GPU node, torchrun)")
    _workload(t, "tune", steps=8, links="throttled", out="out/tune")
    t.add_argument("--budget", type=positive_int, default=None, metavar="SECONDS",
                   help="wall-clock budget of this invocation (runs are estimated from the previous ones)")
    t.add_argument("--dispatcher", default=None, choices=MEASURED_DISPATCHERS,
                   help="the overlapped dispatcher to tune (default alltoall)")
    t.add_argument("--mem-tolerance", type=float, default=None,
                   help="peak memory allowed above the overlap baseline's, as a fraction (default 0.02)")
    t.add_argument("--min-gain", type=float, default=None,
                   help="a knob is kept when it is at least this fraction faster (default 0.005)")
    t.set_defaults(handler=_tune)


def _shape(args) -> str:
    return "comm-bound" if args.comm_bound else args.shape


def _report(args) -> int:
    results = report([Path(d) for d in args.folders], Path(args.out), f"{args.recipe}: {', '.join(args.folders)}",
                     calibration=args.calibration)
    return 0 if results else 1


def _tune(args) -> int:
    if args.budget is None:
        raise UsageError("--budget", None, "`bench tune` needs a wall-clock budget in seconds (--budget SECONDS)",
                         "missing")
    outcomes = tune_links(args.recipe, args.nproc, _shape(args), args.links.split(","), Path(args.out), args.budget,
                          steps=args.steps, warmup=args.warmup, profile=args.profile, extra=args.extra,
                          **{k: v for k, v in (("dispatcher", args.dispatcher), ("mem_tolerance", args.mem_tolerance),
                                               ("min_gain", args.min_gain)) if v is not None})  # else tune's defaults
    return 0 if all(o.winner is not None for o in outcomes) else 1


def _run(args) -> int:
    extra_variants = {"tuned": load_tuned_variant(Path(args.tuned))} if args.tuned else None
    known = {**VARIANTS, **(extra_variants or {})}
    results = run_bench(args.recipe, args.nproc, parse_variants(args.variants, known), args.links.split(","),
                        Path(args.out), args.steps, args.warmup, args.profile, args.extra,
                        shape=_shape(args), extra_variants=extra_variants)
    return 0 if all(r.ok or r.error.startswith("skipped") for r in results) else 1
