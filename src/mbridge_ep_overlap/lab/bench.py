"""A/B benchmark harness: ``mbridge-ep-overlap bench`` and ``scripts/benchmark_ep_overlap.py``.

Contract
--------
Runs one recipe as separate ``torchrun`` jobs (``launch.launch``), one per variant and link: the
same seed, mock data, shape and overrides. A shape and a variant are typed ``RunSpec`` changes
(``SHAPES``, ``VARIANTS``), written as each job's spec file (``spec_file.write_spec``) only at
launch. Before the first job: every argument is checked, the ``--tuned`` file too
(``tune.load_tuned_variant``), then each job's spec is built and judged as ``run_script.py`` will build it
in the job (``check_jobs``: ``pipeline.build`` on this machine with the job's variables - a bad
override or setting is bad usage, exit 2; what the rules refuse is exit 1, every violation of every
job listed), then that this machine has ``--nproc`` CUDA GPUs (``require_gpus``; torch is imported
only there), then that ``--out`` can be a folder (``output_folder``: a symbolic-link loop, a link to
nothing or a file is named as such) - each usage failure one line, exit 2, nothing launched or
written. Variants: ``off``, ``overlap`` (alltoall),
``overlap+delay_wgrad`` (only where Transformer Engine imports), ``deepep`` / ``hybridep`` (only
where ``deep_ep`` imports), plus tuning variants that change one thing the library controls
(``overlap:cdmc1`` = ``CUDA_DEVICE_MAX_CONNECTIONS=1``, ``overlap:hiprio`` = high-priority
all-to-all stream). Links: ``nvlink`` (as the machine is) and
``throttled`` (``NCCL_P2P_DISABLE=1``: GPUs talk through host memory, an inter-node-class link).

Per variant: median and spread of step time over the steady window (after ``--warmup`` steps,
before the profiled steps), tokens/s, peak memory per rank, per-iteration losses and their parity
against ``off`` on the same link and shape, and - from a torch-profiler window on rank 0 - the overlap
efficiency of ``trace.analyze``. Output folder: ``results.json`` (every number),
``benchmarks.md`` (the table) and ``benchmarks.png`` (step time per iteration, speedups; not drawn,
saying so, beyond ``PLOT_MAX_ROWS`` measured rows). Timings are reported, never asserted.

Against ``off`` (``compare_to_baseline``, recomputed by ``bench report`` for old files too): the
speedup, loss parity, the peak-memory delta, the compute time added per step (SM / memory contention
of the overlapped all-to-all), the idle time per step (no kernel running) and the **share of the
possible gain** ``(off - variant) / (off - ideal)`` - with the ideal ``max(compute, all-to-all)`` from
the variant's own profile, and beside it from the ``off`` run's profile. ``bench report`` reads
every ``results.json`` whole and checks each row first (``results.result_from_row``: each field's type,
finite numbers where the report computes; an empty list is no results file): a bad file is bad
usage naming the file, the row and the field, and nothing is written; the work grows linearly with
the rows (20,000 rows in seconds). A ``launch_slurm.py --variants`` run folder (``variants.json``) is
read from its tasks' summaries (``results.array_rows``) and each row gets the step-time model's step for
that cluster beside its measured one (``--calibration FILE``: with that cluster calibration), in a
"measured vs predicted" table. ``parse_variants`` reads ``--variants`` for bench and
``launch_slurm.py`` alike. ``summary_line`` names the
best share of a set of rows. ``bench tune`` (``lab.tune``) searches the overlap knobs; a tuned
result (``tuned.json``) runs as the variant ``tuned`` with ``--tuned PATH``. The command itself
(``bench`` and ``bench tune``) is ``lab.bench_command``, above both.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..base.choices import DEEP_EP_BACKENDS
from ..base.errors import EPOverlapError, UsageError, Violation
from ..spec import RunSpec
from ..target.cluster import RELEVANT_ENV_VARS, ClusterEnvironment
from ..runtime.exits import release_stderr
from .launch import child_environment, launch
from .numerics import compare_losses
from .results import (VariantResult, array_rows, load_calibration, load_results, predict_rows, prediction_lines,  # noqa: F401 - re-exported
                      read_manifest, result_from_row, summarize_run)
from .tables import num, pct, write_json

LINKS = {"nvlink": {}, "throttled": {"NCCL_P2P_DISABLE": "1"}}


@dataclass(frozen=True)
class Variant:
    """One benchmark variant: the ``RunSpec`` fields it changes, the launcher variables it sets,
    and what must be installed for it ('te', 'deep_ep', 'hybrid_ep' or '')."""

    changes: dict
    env: dict = field(default_factory=dict)
    needs: str = ""
    overrides: tuple[str, ...] = ()
    """Hydra-style overrides appended after the shape's and the user's (tuned variants)."""
    source: str = ""
    """The file a variant's settings were read from ('tuned file PATH'), named when they are refused."""


# "overlap" keeps the default-priority stream, as in every earlier run, so rows stay comparable; the
# library's default (high priority) is "overlap:hiprio".
ALLTOALL = {"ep_overlap": True, "dispatcher": "alltoall", "high_priority_a2a": False}
VARIANTS = {
    "off": Variant({"ep_overlap": False}),
    "overlap": Variant(ALLTOALL),
    "overlap+delay_wgrad": Variant({**ALLTOALL, "delay_wgrad": True}, needs="te"),
    "deepep": Variant({**ALLTOALL, "dispatcher": "deepep"}, needs="deep_ep"),
    "hybridep": Variant({**ALLTOALL, "dispatcher": "hybridep"}, needs="hybrid_ep"),
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


def parse_variants(text: str, known: dict[str, Variant] | None = None, flag: str = "--variants") -> list[str]:
    """The variant names of a ``--variants`` comma list, in order (bench and ``launch_slurm.py
    --variants`` read it here). An unknown, empty or repeated name is bad usage naming it."""
    known = known or VARIANTS
    names = [v.strip() for v in str(text).split(",")]
    for v in names:
        if v not in known:
            raise UsageError("variant", v, sorted(known), "unknown" if v else "empty")
    repeated = sorted({v for v in names if names.count(v) > 1})
    if repeated:
        raise UsageError(flag, text, "each variant once (repeated: " + ", ".join(repeated) + ")", "invalid")
    return names


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


def efficiency(r: VariantResult) -> dict:
    """The row's profile analysis, or {} when it has none or recognized no all-to-all kernel (then
    the hidden fraction, exposed time and ideal step would be meaningless)."""
    e = r.overlap_efficiency or {}
    return e if e.get("a2a_s") else {}


def share_of_gain(off_s: float | None, variant_s: float | None, ideal_s: float | None) -> float | None:
    """(off - variant) / (off - ideal): the share of the gain overlap could physically give that it
    gave. None when a value is missing or off is already at the ideal."""
    if not off_s or not variant_s or ideal_s is None or off_s - ideal_s <= 1e-9:
        return None
    return (off_s - variant_s) / (off_s - ideal_s)


def idle_per_step(profile: dict | None) -> tuple[float | None, bool]:
    """(idle seconds per step, estimated). Profiles from ``trace.analyze`` since the idle-time breakdown was added carry
    ``idle_step_s``; for older ones the union of all kernels is bounded from above by
    compute + comm - hidden, so window - that is a lower bound (off by at most the other
    collectives' time, ``comm_s - a2a_s``)."""
    p = profile or {}
    if p.get("idle_step_s") is not None:
        return p["idle_step_s"], False
    if p.get("measured_step_s") is None or p.get("compute_s") is None or p.get("comm_s") is None:
        return None, False
    n = p.get("iterations") or 1
    busy_max = p["compute_s"] + p["comm_s"] - (p.get("hidden_s") or 0.0)
    return max(p["measured_step_s"] - busy_max / n, 0.0), True


def workload_key(r: VariantResult) -> tuple:
    """Rows comparable with each other: same link, model shape, sequence and global batch (the
    micro-batch size may differ: same tokens per step, only more microbatches). Hashable, equal
    exactly when the fields are equal (a list or mapping read from a results.json included)."""
    f = r.finalized or {}
    return (r.link, re.sub(r" mbs\S+", "", shape_label(f)), _hashable(f.get("global_batch_size")))


def _hashable(value):
    """``value`` as a dictionary key equal to another exactly when the values are equal (``==``)."""
    if isinstance(value, (list, tuple)):
        return (list if isinstance(value, list) else tuple, tuple(_hashable(v) for v in value))
    if isinstance(value, dict):
        return (dict, frozenset((k, _hashable(v)) for k, v in value.items()))
    return frozenset(value) if isinstance(value, set) else value


def baselines(results: list[VariantResult]) -> list[VariantResult | None]:
    """For each row the ``off`` row it is compared with: the last ok ``off`` of the same link and
    workload at or before it (a run writes ``off`` first), else the last one after it; None for a
    failed row or a workload without one. Rows of other workloads never mix. One pass, each key
    computed once (a report of thousands of rows took minutes while every row scanned the earlier ones)."""
    keys = [workload_key(r) if r.ok else None for r in results]
    last_off = {key: r for r, key in zip(results, keys) if r.ok and r.variant == "off"}
    off_so_far: dict[tuple, VariantResult] = {}
    chosen: list[VariantResult | None] = []
    for r, key in zip(results, keys):
        if r.ok and r.variant == "off":
            off_so_far[key] = r
        chosen.append(off_so_far.get(key, last_off.get(key)) if r.ok else None)
    return chosen


def compare_to_baseline(results: list[VariantResult]) -> None:
    """Each row against its ``off`` row (``baselines``): speedup, parity, share of the possible gain,
    idle, memory and compute deltas."""
    for r, b in zip(results, baselines(results)):
        if not r.ok:
            continue
        r.idle_step_s, r.idle_estimated = idle_per_step(r.overlap_efficiency)
        if b is None:
            continue
        if r.median_s and b.median_s:
            r.speedup = b.median_s / r.median_s
        if r.peak_gib and b.peak_gib:
            r.peak_vs_off = r.peak_gib / b.peak_gib - 1
        mine, base = r.overlap_efficiency or {}, b.overlap_efficiency or {}
        if mine.get("compute_s") is not None and base.get("compute_s") is not None:
            r.compute_vs_off_s = (mine["compute_s"] / (mine.get("iterations") or 1)
                                  - base["compute_s"] / (base.get("iterations") or 1))
        if r.variant != "off":
            parity = compare_losses(b.losses, r.losses, skipped=set(r.skipped))
            r.parity = "match" if parity.ok else "MISMATCH: " + "; ".join(parity.problems[:2])
            e, eb = efficiency(r), efficiency(b)
            r.share_of_gain = share_of_gain(b.median_s, r.median_s, e.get("ideal_step_s")) if e else None
            r.share_of_gain_off_ideal = share_of_gain(b.median_s, r.median_s, eb.get("ideal_step_s")) if e and eb else None
        else:
            r.parity = "baseline"


def _is_like_for_like(r: VariantResult) -> bool:
    """False for a flex dispatcher (DeepEP / HybridEP) on the throttled link: ``NCCL_P2P_DISABLE``
    throttles NCCL only, their tokens still cross NVLink (see docs/benchmarks.md)."""
    f = r.finalized or {}
    flex = f.get("moe_token_dispatcher_type") == "flex" or r.variant in DEEP_EP_BACKENDS
    return not (flex and r.link == "throttled")


def summary_line(results: list[VariantResult]) -> str:
    """'Best share of the possible gain: NN% (<variant>, <link>, <shape>, <run>)' over the rows whose
    losses matched off, with a recognized all-to-all, like for like, not disqualified by the tuner
    (own-profile ideal; the share against off's ideal follows)."""
    rows = [r for r in results if r.ok and r.variant != "off" and r.parity == "match" and r.share_of_gain is not None
            and _is_like_for_like(r) and not r.disqualified]
    if not rows:
        return "Best share of the possible gain: - (no overlapped row with matching losses and a profile)"
    best = max(rows, key=lambda r: r.share_of_gain)
    extra = f"; {best.share_of_gain_off_ideal:.0%} against the off run's ideal" if best.share_of_gain_off_ideal is not None else ""
    return (f"Best share of the possible gain: {best.share_of_gain:.0%} ({best.variant}, {best.link}, "
            f"{shape_label(best.finalized)}, {best.run or '-'}){extra}")


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
             "| link | variant | median step s | spread s | speedup vs off | tokens/s | peak GiB | peak vs off | "
             "A2A hidden | exposed A2A s/step | idle s/step | compute +s/step vs off | ideal step s | "
             "share of possible gain (vs off's ideal) | losses | shape |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    estimated = False
    for r in results:
        if not r.ok:
            lines.append(f"| {r.link} | {r.variant} | - | - | - | - | - | - | - | - | - | - | - | - | failed: {r.error} | - |")
            continue
        e = efficiency(r)
        n = e.get("iterations") or 1
        speed = f"{r.speedup:.3f}x" if r.speedup else "-"
        idle = "-" if r.idle_step_s is None else (">=" if r.idle_estimated else "") + f"{r.idle_step_s:.3f}"
        estimated |= r.idle_estimated
        compute = "-" if r.compute_vs_off_s is None or r.variant == "off" else f"{r.compute_vs_off_s:+.3f}"
        share = "-" if r.share_of_gain is None else f"{r.share_of_gain:.0%} ({pct(r.share_of_gain_off_ideal)})"
        peak_delta = "-" if r.variant == "off" else pct(r.peak_vs_off, signed=True)
        spread = "-" if r.spread_s is None else f"{r.spread_s[0]:.3f}-{r.spread_s[1]:.3f}"
        lines.append(
            f"| {r.link} | {r.variant} | {num(r.median_s, '.3f')} | {spread} | "
            f"{speed} | {num(r.tokens_per_s, ',.0f')} | {num(r.peak_gib, '.1f')} | {peak_delta} | "
            + (f"{e['hidden_fraction']:.0%} | {e['exposed_s'] / n:.3f} | " if e else "- | - | ")
            + f"{idle} | {compute} | "
            + (f"{e['ideal_step_s']:.3f} | " if e else "- | ")
            + f"{share} | {r.parity}{'; ' + r.disqualified if r.disqualified else ''} | {shape_label(r.finalized)} |"
        )
    lines += ["", summary_line(results), *prediction_lines(results)]
    if estimated:
        lines += ["", "`>=`: idle from a profile recorded before `trace.analyze` measured it (a lower bound, "
                      "short by at most the non-all-to-all collectives' time)."]
    return "\n".join(lines)


PLOT_MAX_ROWS = 100
"""Above this many measured rows no plot is drawn: each row is a line with a legend entry and a
labelled bar (the figure widens with the bars) - 8,000 rows took 90 s for a 530,000-pixel-wide
image nobody can read. The table keeps every row."""


def too_many_to_plot(results: list[VariantResult]) -> str:
    """Why ``results`` are too many for one plot ('' when they are not)."""
    measured = sum(1 for r in results if r.ok)
    if measured <= PLOT_MAX_ROWS:
        return ""
    return f"{measured} measured rows, more than the {PLOT_MAX_ROWS} one plot shows; benchmarks.md has every row"


def plot(results: list[VariantResult], path: Path) -> bool:
    """Step time per iteration and the speedups, as a PNG at ``path``; False when nothing is drawn
    (``too_many_to_plot``, or matplotlib cannot be imported)."""
    if too_many_to_plot(results):
        return False
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
    if ok:  # no line, no legend (matplotlib would warn)
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


def variant_spec(base: RunSpec, variant: str | Variant) -> RunSpec:
    v = VARIANTS[variant] if isinstance(variant, str) else variant
    spec = base.replace(**v.changes)
    return spec.replace(overrides=(*spec.overrides, *v.overrides)) if v.overrides else spec


# run flags after ``--`` that a variant sets, and the variant syntax that does it
_VARIANT_SYNTAX = {
    "ep_overlap": "each variant sets overlap on or off: --variants off,overlap",
    "dispatcher": "the variant names the dispatcher: --variants off,overlap,deepep,hybridep",
    "delay_wgrad": "the variant sets it: --variants off,overlap+delay_wgrad",
    "high_priority_a2a": "the variant sets it: --variants off,overlap:hiprio",
    "a2a_priority": "the variant sets it: --variants off,overlap:hiprio",
}
# what bench takes from the flags after ``--``: the sizes, the overrides, the architecture folder
# (forced balance is what bench sets anyway)
_CARRIED = {"set_overrides", "overrides", "hf_config_dir", "force_balance"}


def shape_spec(recipe: str, shape: str, steps: int, extra: list[str]) -> RunSpec:
    """The spec every variant starts from: recipe, steps, forced balance, the shape, then the
    user's sizes, overrides and architecture folder given after ``--`` (they win). Any other run flag
    there is bad usage naming each such flag - bench would drop it: a variant sets overlap, the
    dispatcher, delayed wgrad and the stream priority (``_VARIANT_SYNTAX``), and the target is this
    machine."""
    from ..runtime.flags import SIZE_FLAGS, add_spec_arguments, parse
    from ..runtime.exits import OneLineArgumentParser

    if shape not in SHAPES:
        raise UsageError("--shape", shape, sorted(SHAPES))
    parser = OneLineArgumentParser(prog="bench -- (run flags)")
    add_spec_arguments(parser, recipe_default=recipe)
    user = parse(parser, extra)
    carried = _CARRIED | set(SIZE_FLAGS.values())
    dropped = [a for a in parser._actions if a.dest not in carried and a.option_strings
               and getattr(user, a.dest, a.default) != a.default]
    if dropped:
        why = [f"{a.option_strings[-1]} ({_VARIANT_SYNTAX.get(a.dest, 'bench runs on this machine' if a.dest != 'recipe' else 'use bench --recipe')})"
               for a in dropped]
        raise UsageError("run flags after --", " ".join(a.option_strings[-1] for a in dropped),
                         f"only sizes, --set/key=value overrides, --hf-config-dir and --force-balance; bench would drop "
                         f"{'; '.join(why)}", "unused")
    sizes = {name: getattr(user, name) for name in SIZE_FLAGS.values() if getattr(user, name) is not None}
    shaped = {"max_steps": steps, **SHAPES[shape], **sizes}
    overrides = (*shaped.pop("overrides", ()), *user.set_overrides, *user.overrides)
    return RunSpec(recipe=recipe, force_balance=True, overrides=overrides, hf_config_dir=user.hf_config_dir,
                   **shaped).validated()


def validate_request(recipe: str, nproc: int, variants: list[str], links: list[str], steps: int, warmup: int,
                     profile: int, known: dict[str, Variant] | None = None) -> None:
    """Every argument checked before anything is launched (bad usage: UsageError, exit 2)."""
    from ..spec import resolve_recipe

    known = known or VARIANTS
    for v in variants:
        if v not in known:
            raise UsageError("variant", v, sorted(known))
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


def _job_target(machine: ClusterEnvironment, nproc: int, env: dict[str, str]) -> ClusterEnvironment:
    """``machine`` (this one, probed) as a job launched with ``env`` on ``nproc`` ranks will probe
    it: the environment ``launch`` gives the job (``launch.child_environment``) and torchrun's
    ``WORLD_SIZE``."""
    seen = child_environment({**env, "WORLD_SIZE": str(nproc)})
    return dataclasses.replace(machine, world_size=nproc,
                               env_vars={name: seen[name] for name in RELEVANT_ENV_VARS if name in seen})


def check_jobs(base: RunSpec, variants: dict[str, Variant], links: list[str], nproc: int) -> None:
    """Before the first job: each job's spec built and judged as ``run_script.py`` will build it in
    the job (``pipeline.build``, the one pipeline ``plan`` uses, on this machine with the job's
    variables and world size). Bad usage is the first ``UsageError`` (naming the file a variant's
    settings came from); the refusals of every job are one ``EPOverlapError`` listing every
    violation. Nothing is launched or written."""
    from ..pipeline import build
    from ..target.probe import probe

    machine = probe()
    violations: dict[str, Violation] = {}
    refused: list[str] = []
    overlap = False
    for name, variant in variants.items():
        spec = variant_spec(base, variant)
        links_refused = []
        for link in links:
            try:
                build(spec, target=_job_target(machine, nproc, {**LINKS[link], **variant.env}))
            except UsageError as e:
                if not variant.source:
                    raise
                raise UsageError(f"{e.what} (variant {name}, {variant.source})", e.value, e.allowed,
                                 e.problem) from None
            except EPOverlapError as e:
                links_refused.append(link)
                violations.update((v.line(), v) for v in e.violations)
                overlap |= spec.ep_overlap
        if links_refused:
            source = f", from {variant.source}" if variant.source else ""
            refused.append(f"{name} on {', '.join(links_refused)}{source}")
    if refused:
        raise EPOverlapError(list(violations.values()), f"bench jobs: {'; '.join(refused)}", overlap=overlap)


def cuda_device_count() -> int:
    """CUDA GPUs visible to this process. torch is imported here, never at module import: ``bench
    --report`` and ``--help`` start in a tenth of a second without it."""
    try:
        import torch
    except ImportError as e:
        raise UsageError("torch", None, f"an importable torch to count this machine's GPUs ({e})", "missing") from None
    return int(torch.cuda.device_count())


def require_gpus(nproc: int, command: str = "bench") -> None:
    """Before anything is launched: this machine has the ``nproc`` CUDA GPUs its torchrun jobs use
    (one per rank). Without them every job would start, fail in its ranks after seconds and leave
    the cause in a rank's log; this says it in one line (UsageError, exit 2)."""
    have = cuda_device_count()
    if have < nproc:
        raise UsageError("--nproc", nproc, f"at most the {have} CUDA GPU(s) this machine has ({command} runs one torchrun "
                         "rank per GPU on this machine: run it on a GPU node, or lower --nproc)",
                         "too many GPUs for this machine:")


def _why_not_a_folder(path: Path) -> str:
    """Why ``path`` cannot be made a folder: the first of it and its parents, from the top, that
    is a symbolic-link loop, a link to nothing or not a folder ('' when none is)."""
    for p in [*reversed(path.parents), path]:
        try:
            st = os.stat(p)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return f"{p} is a symbolic-link loop"
            if os.path.islink(p):
                return f"{p} is a symbolic link to {os.readlink(p)}, which does not exist"
            if e.errno == errno.ENOENT:
                return ""
            return f"{p}: {e.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{p} exists and is not a folder"
    return ""


def output_folder(path: Path, what: str = "--out") -> Path:
    """``path`` created with its parents, or bad usage saying truthfully why it cannot be an output
    folder (a symbolic-link loop, a link to nothing, a file) - before anything runs or is written."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # mkdir(exist_ok) says "File exists" for a link loop or a dangling link
        why = _why_not_a_folder(path) if e.errno in (errno.EEXIST, errno.ENOTDIR, errno.ELOOP) else ""
        if not why:
            raise
        raise UsageError(what, str(path), f"a folder, or a path where one can be created ({why})", "unusable") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "not writable", str(path))
    return path


def run_name(link: str, variant: str) -> str:
    """The run's folder name under ``<out>/runs`` (and its torchrun job name)."""
    return f"{link}__{re.sub(r'[^A-Za-z0-9_.-]+', '_', variant)}"


def run_variant(base: RunSpec, name: str, variant: Variant, link: str, out: Path, *, nproc: int, steps: int,
                warmup: int, profile: int, timeout_s: float) -> VariantResult:
    """One variant on one link as its own torchrun job (``launch``); a failed job is a failed row."""
    from ..runtime.spec_file import write_spec

    spec = variant_spec(base, variant)
    args = write_spec(spec, out / "runs" / f"{run_name(link, name)}.spec.json") + (
        ["--profile-steps", f"{steps - profile}:{steps}"] if profile else [])
    env = {**LINKS[link], **variant.env}
    run = launch(run_name(link, name), nproc, args, timeout_s=timeout_s, env=env, log_root=out / "runs")
    if run.returncode != 0 or run.summary is None:
        first = (run.describe_failure().splitlines() or ["failed"])[0]
        return VariantResult(name, link, ok=False, error=first, run=str(out), run_s=run.seconds,
                             overrides=list(variant.overrides), env=dict(variant.env))
    fin = run.summary["finalized"]
    tokens = int(fin["global_batch_size"]) * int(fin.get("seq_length") or 0)
    r = summarize_run(name, link, run.summary, warmup, tokens)
    r.run, r.run_s, r.overrides, r.env = str(out), run.seconds, list(variant.overrides), dict(variant.env)
    return r


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
    extra_variants: dict[str, Variant] | None = None,
) -> list[VariantResult]:
    known = {**VARIANTS, **(extra_variants or {})}
    validate_request(recipe, nproc, variants, links, steps, warmup, profile, known)
    base = shape_spec(recipe, shape, steps, list(extra or []))
    if "off" not in variants:
        variants = ["off", *variants]
    unavailable = available_variants()
    # a bad override or tuned setting is bad usage, a refused one exit 1, before torchrun starts
    check_jobs(base, {v: known[v] for v in variants if not unavailable.get(v)}, links, nproc)
    require_gpus(nproc)  # after the request's own checks: a bad flag is reported as such on any machine
    output_folder(out)
    release_stderr()  # jobs start: what the libraries printed so far is shown, nothing more is held
    results: list[VariantResult] = []
    for link in links:
        for variant in variants:
            if unavailable.get(variant):
                results.append(VariantResult(variant, link, ok=False, error=f"skipped: {unavailable[variant]}"))
                continue
            r = run_variant(base, variant, known[variant], link, out, nproc=nproc, steps=steps, warmup=warmup,
                            profile=profile, timeout_s=timeout_s)
            results.append(r)
            if r.ok:
                print(f"bench: {link}/{variant}: median {r.median_s:.3f}s", flush=True)
            write_json(results, out)  # partial results survive a later crash or time limit
    compare_to_baseline(results)
    write_outputs(results, out, f"{recipe}, {nproc} GPUs, shape {shape} {' '.join(extra or [])}".strip())
    return results


def report(folders: list[Path], out: Path, title: str, calibration: str | None = None) -> list[VariantResult]:
    """One table and plot from several bench output folders (e.g. one per link or machine run).

    Each folder is compared against its own ``off`` rows; the rows are then put side by side. Every
    file is read and checked before anything is computed or written (bad usage names every bad
    folder, file and row, with its field, in one line). A folder of ``launch_slurm.py --variants``
    (``variants.json``) is read from its tasks' summaries, and each row's measured step is put beside
    the step-time model's for that cluster (with the ``calibration`` file when given).
    """
    cal, source = None, "shipped calibration"
    if calibration is not None:
        cal, source = load_calibration(calibration).calibration(), f"calibration {calibration}"
    loaded: list[tuple[Path, list[VariantResult]]] = []
    problems: list[UsageError] = []
    for folder in folders:
        path = Path(folder) / "results.json"
        try:
            manifest = read_manifest(Path(folder))
            if manifest is not None:
                rows = array_rows(Path(folder), manifest)
                predict_rows(rows, manifest, cal, source)
                loaded.append((Path(folder), rows))
                continue
            if not path.exists():
                raise UsageError("--report folder", str(folder), "a bench output folder holding results.json, or a "
                                 "launch_slurm.py --variants folder holding variants.json")
            loaded.append((Path(folder), load_results(path)))
        except UsageError as e:
            problems.append(e)
    if len(problems) == 1:
        raise problems[0]
    if problems:  # every bad folder and row named, in one line
        raise UsageError("--report", f"{len(problems)} folders", "; ".join(str(e) for e in problems), "invalid")
    results: list[VariantResult] = []
    for folder, rows in loaded:
        for r in rows:
            r.run = r.run or str(folder)
        compare_to_baseline(rows)
        results.extend(rows)
    write_outputs(results, output_folder(out), title)
    return results


def write_outputs(results: list[VariantResult], out: Path, title: str) -> None:
    """results.json, benchmarks.md and benchmarks.png in ``out``; the table is also printed. The
    table is made before anything is written (no half-written folder)."""
    table = markdown(results, title)
    write_json(results, out)
    (out / "benchmarks.md").write_text(table + "\n")
    drawn = plot(results, out / "benchmarks.png")
    if not drawn:  # a plot of another run must not stand beside this table
        (out / "benchmarks.png").unlink(missing_ok=True)
    print(table)
    if not drawn:
        print(f"benchmarks.png: not drawn ({too_many_to_plot(results) or 'matplotlib cannot be imported'})")
