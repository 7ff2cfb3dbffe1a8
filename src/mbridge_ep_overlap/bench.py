"""A/B benchmark harness: ``mbridge-ep-overlap bench`` and ``scripts/benchmark_ep_overlap.py``.

Contract
--------
Runs one recipe as separate ``torchrun`` jobs (``launch.launch``), one per variant and link: the
same seed, mock data, shapes and overrides; only the variant's flags differ. Variants:
``off``, ``overlap`` (alltoall), ``overlap+delay_wgrad`` (only where Transformer Engine imports),
``deepep`` / ``hybridep`` (only where ``deep_ep`` imports), plus tuning variants that change one
thing the library controls (``overlap:cdmc1`` = ``CUDA_DEVICE_MAX_CONNECTIONS=1``,
``overlap:hiprio`` = high-priority all-to-all stream). Links: ``nvlink`` (as the machine is) and
``throttled`` (``NCCL_P2P_DISABLE=1``: GPUs talk through host memory, an inter-node-class link).

Per variant: median and spread of step time over the steady window (after ``--warmup`` steps,
before the profiled steps), tokens/s, peak memory per rank, per-iteration losses and their parity
against ``off`` on the same link, and - from a torch-profiler window on rank 0 - the overlap
efficiency of ``trace.analyze``. Output folder: ``results.json`` (every number),
``benchmarks.md`` (the table) and ``benchmarks.png`` (step time per iteration, speedups).
Timings are reported, never asserted.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UsageError
from .launch import launch
from .numerics import compare_losses, losses_from_summary

LINKS = {"nvlink": {}, "throttled": {"NCCL_P2P_DISABLE": "1"}}
VARIANTS = {
    "off": (["--ep-overlap", "off"], {}),
    "overlap": (["--ep-overlap", "on", "--dispatcher", "alltoall"], {}),
    "overlap+delay_wgrad": (["--ep-overlap", "on", "--dispatcher", "alltoall", "--delay-wgrad", "on"], {}),
    "deepep": (["--ep-overlap", "on", "--dispatcher", "deepep"], {}),
    "hybridep": (["--ep-overlap", "on", "--dispatcher", "hybridep"], {}),
    "overlap:cdmc1": (["--ep-overlap", "on", "--dispatcher", "alltoall"], {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    "overlap:hiprio": (["--ep-overlap", "on", "--dispatcher", "alltoall", "--a2a-priority", "high"], {}),
}
# Benchmark shapes (overrides and run_script flags on top of the recipe; flags the user passes after
# ``--`` come later and win). The proxy's own default is sized for quick functional runs.
# ``comm-bound``: hidden 2048, 16 experts, top-8, expert FFN 0.75 x hidden, the proxy's small
# attention (16 heads x 64) and sequence 512 - the all-to-all is longer than the compute it could
# hide behind on the throttled link. ``balanced``: the same with an expert FFN of 1.5 x hidden.
# ``long-seq``: the balanced MoE block with Qwen3-30B-A3B's attention (32 heads x 128, 4 KV groups)
# at sequence 4096 (micro-batch 2, 8192 tokens per microbatch as in the other shapes). Combined-1F1B
# hides each *combine* behind the other microbatch's attention and each *dispatch* behind its expert
# MLP (MCore ``TransformerLayerSchedulePlan.run``), so both halves need compute of the order of the
# all-to-all - the regime overlap is designed for. Real models: Qwen3-30B-A3B FFN 0.375 x hidden,
# top-8 of 128 experts, DeepSeek-V3 0.29 x hidden, top-8 of 256, both at sequence 4096 and longer.
_MOE = ["model.hidden_size=2048", "model.moe_router_topk=8"]
_WIDE = [*_MOE, "model.num_attention_heads=16"]
SHAPES = {
    "default": [],
    "comm-bound": [*_WIDE, "model.moe_ffn_hidden_size=1536"],
    "balanced": [*_WIDE, "model.moe_ffn_hidden_size=3072"],
    "long-seq": [*_MOE, "model.moe_ffn_hidden_size=3072", "model.num_attention_heads=32", "model.kv_channels=128",
                 "model.num_query_groups=4", "--seq-length", "4096", "--micro-batch-size", "2",
                 "--global-batch-size", "64"],
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
    """Variant -> reason it cannot run here ('' when it can)."""
    from .environment import probe
    from .import_shims import real_te_available

    env = probe()
    why = {v: "" for v in VARIANTS}
    if not real_te_available():
        why["overlap+delay_wgrad"] = "Transformer Engine not installed"
    if not env.deep_ep_version:
        why["deepep"] = why["hybridep"] = "deep_ep not importable"
    elif not env.hybrid_ep_available:
        why["hybridep"] = "deep_ep has no HybridEPBuffer"
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
    base = {r.link: r for r in results if r.variant == "off" and r.ok}
    for r in results:
        b = base.get(r.link)
        if not r.ok or b is None:
            continue
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
) -> list[VariantResult]:
    for v in variants:
        if v not in VARIANTS:
            raise UsageError("variant", v, sorted(VARIANTS))
    for link in links:
        if link not in LINKS:
            raise UsageError("link", link, sorted(LINKS))
    if "off" not in variants:
        variants = ["off", *variants]
    unavailable = available_variants()
    out.mkdir(parents=True, exist_ok=True)
    extra = list(extra or [])
    results: list[VariantResult] = []
    for link in links:
        for variant in variants:
            if unavailable.get(variant):
                results.append(VariantResult(variant, link, ok=False, error=f"skipped: {unavailable[variant]}"))
                continue
            flags, env = VARIANTS[variant]
            args = ["--recipe", recipe, "--max-steps", str(steps), "--force-balance",
                    "--profile-steps", f"{steps - profile}:{steps}", *flags, *extra]
            run = launch(f"{link}__{variant.replace(':', '_').replace('+', '_')}", nproc, args, timeout_s=timeout_s,
                         env={**LINKS[link], **env}, log_root=out / "runs")
            if run.returncode != 0 or run.summary is None:
                results.append(VariantResult(variant, link, ok=False, error=run.describe_failure().splitlines()[0]))
                continue
            fin = run.summary["finalized"]
            tokens = int(fin["global_batch_size"]) * int(fin.get("seq_length") or 0)
            results.append(summarize_run(variant, link, run.summary, warmup, tokens))
            print(f"bench: {link}/{variant}: median {results[-1].median_s:.3f}s", flush=True)
            _write_json(results, out)  # partial results survive a later crash or time limit
    compare_to_baseline(results)
    _write_outputs(results, out, f"{recipe}, {nproc} GPUs, {' '.join(extra)}")
    return results


def load_results(path: Path) -> list[VariantResult]:
    """The ``VariantResult`` rows of a ``results.json`` written by ``run_bench``."""
    rows = []
    for d in json.loads(Path(path).read_text()):
        r = VariantResult(**d)
        r.spread_s = tuple(r.spread_s) if r.spread_s else None
        r.losses = {int(k): v for k, v in r.losses.items()}
        rows.append(r)
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
    p = sub.add_parser("bench", help="A/B benchmark of EP-overlap variants (GPU node, torchrun)")
    p.add_argument("--recipe", default="qwen3_moe_proxy")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--variants", default="off,overlap", help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--links", default="nvlink,throttled", help="comma list of nvlink, throttled")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", type=int, default=2, help="profiled steps at the end (excluded from timing)")
    p.add_argument("--shape", default="default", help=f"one of {', '.join(SHAPES)} (overrides in bench.SHAPES)")
    p.add_argument("--comm-bound", action="store_true", help="same as --shape comm-bound")
    p.add_argument("--out", default="out/bench")
    p.add_argument("--report", nargs="+", metavar="DIR", help="run nothing: merge these bench output folders into --out")
    p.add_argument("extra", nargs="*", help="run_script flags / key=value overrides for every variant")
    p.set_defaults(handler=_main)


def _main(args) -> int:
    if args.report:
        results = report([Path(d) for d in args.report], Path(args.out), f"{args.recipe}: {', '.join(args.report)}")
        return 0 if results else 1
    shape = "comm-bound" if args.comm_bound else args.shape
    if shape not in SHAPES:
        raise UsageError("--shape", shape, sorted(SHAPES))
    extra = [*SHAPES[shape], *args.extra]
    results = run_bench(args.recipe, args.nproc, args.variants.split(","), args.links.split(","), Path(args.out),
                        args.steps, args.warmup, args.profile, extra)
    return 0 if all(r.ok or r.error.startswith("skipped") for r in results) else 1
