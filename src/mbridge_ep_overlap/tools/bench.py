"""A/B benchmark harness: ``mbridge-ep-overlap bench`` and ``scripts/benchmark_ep_overlap.py``.

Contract
--------
Runs one recipe as separate ``torchrun`` jobs (``launch.launch``), one per variant and link: the
same seed, mock data, shape and overrides. A shape and a variant are typed ``RunSpec`` changes
(``SHAPES``, ``VARIANTS``), turned into ``run_script.py`` flags by ``flags.to_argv`` only at
launch; every argument is checked before anything is launched. Variants:
``off``, ``overlap`` (alltoall), ``overlap+delay_wgrad`` (only where Transformer Engine imports),
``deepep`` / ``hybridep`` (only where ``deep_ep`` imports), plus tuning variants that change one
thing the library controls (``overlap:cdmc1`` = ``CUDA_DEVICE_MAX_CONNECTIONS=1``,
``overlap:hiprio`` = high-priority all-to-all stream). Links: ``nvlink`` (as the machine is) and
``throttled`` (``NCCL_P2P_DISABLE=1``: GPUs talk through host memory, an inter-node-class link).

Per variant: median and spread of step time over the steady window (after ``--warmup`` steps,
before the profiled steps), tokens/s, peak memory per rank, per-iteration losses and their parity
against ``off`` on the same link and shape, and - from a torch-profiler window on rank 0 - the overlap
efficiency of ``trace.analyze``. Output folder: ``results.json`` (every number),
``benchmarks.md`` (the table) and ``benchmarks.png`` (step time per iteration, speedups).
Timings are reported, never asserted.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import UsageError
from ..spec import RunSpec
from .launch import launch
from .numerics import compare_losses, losses_from_summary

LINKS = {"nvlink": {}, "throttled": {"NCCL_P2P_DISABLE": "1"}}


@dataclass(frozen=True)
class Variant:
    """One benchmark variant: the ``RunSpec`` fields it changes, the launcher variables it sets,
    and what must be installed for it ('te', 'deep_ep', 'hybrid_ep' or '')."""

    changes: dict
    env: dict = field(default_factory=dict)
    needs: str = ""


ALLTOALL = {"ep_overlap": True, "dispatcher": "alltoall"}
VARIANTS = {
    "off": Variant({"ep_overlap": False}),
    "overlap": Variant(ALLTOALL),
    "overlap+delay_wgrad": Variant({**ALLTOALL, "delay_wgrad": True}, needs="te"),
    "deepep": Variant({"ep_overlap": True, "dispatcher": "deepep"}, needs="deep_ep"),
    "hybridep": Variant({"ep_overlap": True, "dispatcher": "hybridep"}, needs="hybrid_ep"),
    "overlap:cdmc1": Variant(ALLTOALL, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    "overlap:hiprio": Variant({**ALLTOALL, "high_priority_a2a": True}),
}
# Benchmark shapes: RunSpec fields and overrides on top of the recipe; what the user passes after
# ``--`` comes later and wins. The proxy's own default is sized for quick functional runs.
# ``comm-bound``: hidden 2048, 16 experts, top-8, expert FFN 0.75 x hidden, the proxy's small
# attention (16 heads x 64) and sequence 512 - the all-to-all is longer than the compute it could
# hide behind on the throttled link. ``balanced``: the same with an expert FFN of 1.5 x hidden.
# ``long-seq``: the balanced MoE block with Qwen3-30B-A3B's attention (32 heads x 128, 4 KV groups)
# at sequence 4096 (micro-batch 2, 8192 tokens per microbatch as in the other shapes). Combined-1F1B
# hides each *combine* behind the other microbatch's attention and each *dispatch* behind its expert
# MLP (MCore ``TransformerLayerSchedulePlan.run``), so both halves need compute of the order of the
# all-to-all - the regime overlap is designed for. Real models: Qwen3-30B-A3B FFN 0.375 x hidden,
# top-8 of 128 experts, DeepSeek-V3 0.29 x hidden, top-8 of 256, both at sequence 4096 and longer.
_MOE = ("model.hidden_size=2048", "model.moe_router_topk=8")
_WIDE = (*_MOE, "model.num_attention_heads=16")
_SHORT = {"seq_length": 512, "micro_batch_size": 16, "global_batch_size": 512}
SHAPES = {
    "default": {},
    "comm-bound": {**_SHORT, "overrides": (*_WIDE, "model.moe_ffn_hidden_size=1536")},
    "balanced": {**_SHORT, "overrides": (*_WIDE, "model.moe_ffn_hidden_size=3072")},
    "long-seq": {"seq_length": 4096, "micro_batch_size": 2, "global_batch_size": 64,
                 "overrides": (*_MOE, "model.moe_ffn_hidden_size=3072", "model.num_attention_heads=32",
                               "model.kv_channels=128", "model.num_query_groups=4")},
}


@dataclass
class VariantResult:
    variant: str
    link: str
    ok: bool
    error: str = ""
    step_times: list[float] = field(default_factory=list)
    median_s: float | None = None
    spread_s: tuple[float, float] | None = None
    tokens_per_s: float | None = None
    peak_gib: float | None = None
    losses: dict[int, float | None] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)
    overlap_efficiency: dict | None = None
    speedup: float | None = None
    parity: str = ""
    finalized: dict = field(default_factory=dict)


def available_variants() -> dict[str, str]:
    """Variant -> reason it cannot run here ('' when it can), from the same facts the rules read."""
    from ..core import dispatcher
    from ..target.probe import probe

    env = probe()
    why = {}
    for name, v in VARIANTS.items():
        if v.needs == "te" and not env.te_version:
            why[name] = "Transformer Engine not installed"
        elif v.needs in ("deep_ep", "hybrid_ep"):
            backend = "hybridep" if v.needs == "hybrid_ep" else "deepep"
            why[name] = "; ".join(dispatcher.problems(backend, env)) if env.has_gpu else "no CUDA GPU visible"
        else:
            why[name] = ""
    return why


def summarize_run(variant: str, link: str, summary: dict, warmup: int, tokens_per_step: int) -> VariantResult:
    steps = summary["steps"]
    profiled = set(range(*summary["profile"]["steps"])) if summary.get("profile") else set()
    times = [s["step_time_s"] for i, s in enumerate(steps) if i >= warmup and i not in profiled]
    losses, skipped = losses_from_summary(summary)
    r = VariantResult(variant, link, ok=True, step_times=[s["step_time_s"] for s in steps],
                      losses=losses, skipped=sorted(skipped), finalized=summary.get("finalized", {}))
    if times:
        r.median_s = statistics.median(times)
        r.spread_s = (min(times), max(times))
        r.tokens_per_s = tokens_per_step / r.median_s
    r.peak_gib = max(summary.get("peak_memory_gib_per_rank") or [0.0])
    if summary.get("profile"):
        r.overlap_efficiency = summary["profile"]["overlap_efficiency"]
    return r


def compare_to_baseline(results: list[VariantResult]) -> None:
    """Each row against the ``off`` row of the same link and shape that precedes it (a run writes
    ``off`` first), else any ``off`` of that link and shape; rows of other shapes never mix."""
    for i, r in enumerate(results):
        key = (r.link, shape_label(r.finalized))
        offs = [o for o in results[: i + 1] if o.variant == "off" and o.ok and (o.link, shape_label(o.finalized)) == key]
        offs = offs or [o for o in results if o.variant == "off" and o.ok and (o.link, shape_label(o.finalized)) == key]
        if not r.ok or not offs:
            continue
        b = offs[-1]
        if r.median_s and b.median_s:
            r.speedup = b.median_s / r.median_s
        if r.variant != "off":
            parity = compare_losses(b.losses, r.losses, skipped=set(r.skipped))
            r.parity = "match" if parity.ok else "MISMATCH: " + "; ".join(parity.problems[:2])
        else:
            r.parity = "baseline"


def shape_label(finalized: dict) -> str:
    """'h2048 ffn1536 top8/16 mbs16 seq512' from a run's finalized fields ('-' when not recorded)."""
    f = finalized or {}
    if not f.get("hidden_size"):
        return "-"
    attn = f" attn{f['num_attention_heads']}x{f['kv_channels']}" if f.get("num_attention_heads") and f.get("kv_channels") else ""
    return (f"h{f['hidden_size']}{attn} ffn{f.get('moe_ffn_hidden_size')} top{f.get('moe_router_topk')}/"
            f"{f.get('num_moe_experts')} mbs{f.get('micro_batch_size')} seq{f.get('seq_length')}")


def markdown(results: list[VariantResult], title: str) -> str:
    lines = [f"### {title}", "",
             "| link | variant | median step s | spread s | speedup vs off | tokens/s | peak GiB | A2A hidden | exposed A2A s/step | ideal step s | losses | shape |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if not r.ok:
            lines.append(f"| {r.link} | {r.variant} | - | - | - | - | - | - | - | - | failed: {r.error} | - |")
            continue
        e = r.overlap_efficiency or {}
        n = e.get("iterations") or 1
        if e and not e.get("a2a_s"):  # no all-to-all kernel recognized: nothing to measure
            e = {}
        lines.append(
            f"| {r.link} | {r.variant} | {r.median_s:.3f} | {r.spread_s[0]:.3f}-{r.spread_s[1]:.3f} | "
            f"{r.speedup:.3f}x | {r.tokens_per_s:,.0f} | {r.peak_gib:.1f} | "
            + (f"{e['hidden_fraction']:.0%} | {e['exposed_s'] / n:.3f} | {e['ideal_step_s']:.3f} | " if e else "- | - | - | ")
            + f"{r.parity} | {shape_label(r.finalized)} |"
        )
    return "\n".join(lines)


def plot(results: list[VariantResult], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in results if r.ok]
    several_shapes = len({shape_label(r.finalized) for r in ok}) > 1

    def name(r: VariantResult, sep: str) -> str:
        f = r.finalized or {}
        tag = f"{sep}s{f.get('seq_length')} f{f.get('moe_ffn_hidden_size')}" if several_shapes else ""
        return f"{r.link}{sep}{r.variant}{tag}"

    compared = [r for r in ok if r.variant != "off" and r.speedup]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13 + max(0, len(compared) - 6) * 0.9, 4.5),
                                   gridspec_kw={"width_ratios": [1, max(1.0, len(compared) / 6)]})
    for r in ok:
        ax1.plot(range(len(r.step_times)), r.step_times, marker="o", ms=3, label=name(r, " / "))
    ax1.set(xlabel="iteration", ylabel="step time (s)", title="step time per iteration")
    ax1.set_yscale("log")
    ax1.legend(fontsize=7)
    labels = [name(r, "\n") for r in compared]
    values = [r.speedup for r in compared]
    ax2.bar(range(len(values)), values, color=["tab:green" if v >= 1 else "tab:red" for v in values])
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set_xticks(range(len(values)), labels, fontsize=7)
    ax2.set(ylabel="speedup vs overlap off", title="median step-time speedup")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def variant_spec(base: RunSpec, variant: str) -> RunSpec:
    return base.replace(**VARIANTS[variant].changes)


def shape_spec(recipe: str, shape: str, steps: int, extra: list[str]) -> RunSpec:
    """The spec every variant starts from: recipe, steps, forced balance, the shape, then the
    user's flags and overrides given after ``--`` (they win)."""
    from .flags import SIZE_FLAGS, add_spec_arguments, parse
    from .exits import OneLineArgumentParser

    if shape not in SHAPES:
        raise UsageError("--shape", shape, sorted(SHAPES))
    parser = OneLineArgumentParser(prog="bench -- (run flags)")
    add_spec_arguments(parser, recipe_default=recipe)
    user = parse(parser, extra)
    sizes = {name: getattr(user, name) for name in SIZE_FLAGS.values() if getattr(user, name) is not None}
    shaped = {"max_steps": steps, **SHAPES[shape], **sizes}
    overrides = (*shaped.pop("overrides", ()), *user.set_overrides, *user.overrides)
    return RunSpec(recipe=recipe, force_balance=True, overrides=overrides, **shaped).validated()


def validate_request(recipe: str, nproc: int, variants: list[str], links: list[str], steps: int, warmup: int,
                     profile: int) -> None:
    """Every argument checked before anything is launched (bad usage: UsageError, exit 2)."""
    from ..spec import resolve_recipe

    for v in variants:
        if v not in VARIANTS:
            raise UsageError("variant", v, sorted(VARIANTS))
    for link in links:
        if link not in LINKS:
            raise UsageError("link", link, sorted(LINKS))
    for what, value, low in (("--nproc", nproc, 1), ("--steps", steps, 1), ("--warmup", warmup, 0), ("--profile", profile, 0)):
        if not isinstance(value, int) or value < low:
            raise UsageError(what, value, f"an integer >= {low}", "invalid")
    if warmup + profile >= steps:
        raise UsageError("--steps", steps, f"more than --warmup + --profile ({warmup} + {profile}): no steady window",
                         "invalid")
    resolve_recipe(recipe)


def run_bench(
    recipe: str,
    nproc: int,
    variants: list[str],
    links: list[str],
    out: Path,
    steps: int = 12,
    warmup: int = 3,
    profile: int = 2,
    extra: list[str] | None = None,
    timeout_s: float = 300,
    shape: str = "default",
) -> list[VariantResult]:
    from .flags import to_argv

    validate_request(recipe, nproc, variants, links, steps, warmup, profile)
    base = shape_spec(recipe, shape, steps, list(extra or []))
    if "off" not in variants:
        variants = ["off", *variants]
    unavailable = available_variants()
    out.mkdir(parents=True, exist_ok=True)
    results: list[VariantResult] = []
    for link in links:
        for variant in variants:
            if unavailable.get(variant):
                results.append(VariantResult(variant, link, ok=False, error=f"skipped: {unavailable[variant]}"))
                continue
            spec = variant_spec(base, variant)
            args = [*to_argv(spec), "--profile-steps", f"{steps - profile}:{steps}"]
            run = launch(f"{link}__{variant.replace(':', '_').replace('+', '_')}", nproc, args, timeout_s=timeout_s,
                         env={**LINKS[link], **VARIANTS[variant].env}, log_root=out / "runs")
            if run.returncode != 0 or run.summary is None:
                results.append(VariantResult(variant, link, ok=False, error=run.describe_failure().splitlines()[0]))
                continue
            fin = run.summary["finalized"]
            tokens = int(fin["global_batch_size"]) * int(fin.get("seq_length") or 0)
            results.append(summarize_run(variant, link, run.summary, warmup, tokens))
            print(f"bench: {link}/{variant}: median {results[-1].median_s:.3f}s", flush=True)
            _write_json(results, out)  # partial results survive a later crash or time limit
    compare_to_baseline(results)
    _write_outputs(results, out, f"{recipe}, {nproc} GPUs, shape {shape} {' '.join(extra or [])}".strip())
    return results


def load_results(path: Path) -> list[VariantResult]:
    """The ``VariantResult`` rows of a ``results.json`` written by ``run_bench`` (UsageError naming
    the file when it is not one)."""
    try:
        data = json.loads(Path(path).read_text())
        rows = []
        for d in data:
            r = VariantResult(**d)
            r.spread_s = tuple(r.spread_s) if r.spread_s else None
            r.losses = {int(k): v for k, v in (r.losses or {}).items()}
            rows.append(r)
    except (ValueError, TypeError, AttributeError) as e:
        raise UsageError("bench results file", str(path), f"a results.json written by bench ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})", "unreadable") from None
    return rows


def report(folders: list[Path], out: Path, title: str) -> list[VariantResult]:
    """One table and plot from several bench output folders (e.g. one per link or machine run).

    Each folder is compared against its own ``off`` rows; the rows are then put side by side.
    """
    results: list[VariantResult] = []
    for folder in folders:
        path = Path(folder) / "results.json"
        if not path.exists():
            raise UsageError("--report folder", str(folder), "a bench output folder holding results.json")
        rows = load_results(path)
        compare_to_baseline(rows)
        results.extend(rows)
    out.mkdir(parents=True, exist_ok=True)
    _write_outputs(results, out, title)
    return results


def _write_json(results: list[VariantResult], out: Path) -> None:
    (out / "results.json").write_text(json.dumps([r.__dict__ for r in results], indent=2, default=str))


def _write_outputs(results: list[VariantResult], out: Path, title: str) -> None:
    """results.json, benchmarks.md and benchmarks.png in ``out``; the table is also printed."""
    _write_json(results, out)
    table = markdown(results, title)
    (out / "benchmarks.md").write_text(table + "\n")
    plot(results, out / "benchmarks.png")
    print(table)


def add_parser(sub) -> None:
    from .exits import positive_int

    p = sub.add_parser("bench", help="A/B benchmark of EP-overlap variants (GPU node, torchrun)")
    p.add_argument("--recipe", default="qwen3_moe_proxy")
    p.add_argument("--nproc", type=positive_int, default=2)
    p.add_argument("--variants", default="off,overlap", help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--links", default="nvlink,throttled", help="comma list of nvlink, throttled")
    p.add_argument("--steps", type=positive_int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", type=int, default=2, help="profiled steps at the end (excluded from timing)")
    p.add_argument("--shape", default="default", choices=sorted(SHAPES), help="benchmark shape (bench.SHAPES)")
    p.add_argument("--comm-bound", action="store_true", help="same as --shape comm-bound")
    p.add_argument("--out", default="out/bench")
    p.add_argument("--report", nargs="+", metavar="DIR", help="run nothing: merge these bench output folders into --out")
    p.add_argument("extra", nargs="*", help="run_script flags / key=value overrides for every variant (after --)")
    p.set_defaults(handler=_main)


def _main(args) -> int:
    if args.report:
        results = report([Path(d) for d in args.report], Path(args.out), f"{args.recipe}: {', '.join(args.report)}")
        return 0 if results else 1
    results = run_bench(args.recipe, args.nproc, args.variants.split(","), args.links.split(","), Path(args.out),
                        args.steps, args.warmup, args.profile, args.extra,
                        shape="comm-bound" if args.comm_bound else args.shape)
    return 0 if all(r.ok or r.error.startswith("skipped") for r in results) else 1
