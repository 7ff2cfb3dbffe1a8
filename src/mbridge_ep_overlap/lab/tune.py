"""``mbridge-ep-overlap bench tune``: search the EP-overlap knobs for one recipe, shape and link.

Contract
--------
``tune(recipe, nproc, shape, link, out, budget_s)`` measures, as real ``torchrun`` jobs through the
benchmark's own machinery (``bench.run_variant``: same seed, mock data, shape, steps, profiler
window), first overlap **off** and plain **overlap** (the baselines), then a greedy coordinate
search: one knob at a time, each of its options on top of the best so far; the fastest option that
qualifies is kept when it beats the best by ``min_gain``. A candidate qualifies when its job
succeeded, its per-iteration losses match off's (``numerics.compare_losses``) and its peak memory is
at most the overlap baseline's times ``1 + mem_tolerance``. Before each candidate the run time is
estimated from the runs so far; the search stops when the next run would not fit in the budget.
Baselines always run (nothing can be ranked without them). Before the first job every argument is
checked and the two baselines are built and judged as their jobs will build them
(``bench.check_jobs``: a bad override is bad usage, a refused config exit 1 with every violation),
then that this machine has ``nproc`` CUDA GPUs (``bench.require_gpus``) and that ``out`` can be a
folder (``bench.output_folder``): each usage failure is one line (exit 2), nothing launched or
written.

Knobs (``KNOBS``; a knob is a function of the context giving typed ``Change`` options, or the
reason it does not apply): the high-priority all-to-all stream, Megatron-Core's per-process-group
NCCL options for the EP group (``dist.nccl_communicator_config_path``: a YAML file generated per
candidate, ``nccl_yaml``), DeepEP/HybridEP SMs (flex dispatchers only), more microbatches (the
micro-batch halved, same global batch), ``CUDA_DEVICE_MAX_CONNECTIONS``, fused permutation (only
where Transformer Engine imports), ``ep_overlap_early_attn_memory_release``. Their order comes from
the overlap baseline's trace (``order_knobs``): the high-priority stream first, then the knob that
acts on the largest measured loss (SM contention, exposed all-to-all inside the overlapped span,
first/last microbatch, idle), the memory knob last.

Outputs in ``out``: ``tune.json`` (the state: every measured candidate; a rerun with the same
request on the same host resumes from it and measures only what is missing; one whose rows fail
``results.result_from_row`` is set aside and measured afresh, saying so), ``results.json`` /
``benchmarks.md`` / ``benchmarks.png`` (the bench outputs; ``bench report`` reads them),
``tune.md`` (evidence, order, ranking, winner), and the winner: ``tuned.json`` (``{"overrides":
[...], "env": {...}, "measured": {...}, ...}``), ``tuned.overrides`` (one ``key=value`` per line:
trailing ``run_script.py`` arguments or ``plan --set``) and, when the winner sets NCCL options,
``nccl_communicator.yaml`` (empty ``tuned.overrides`` and ``"ep_overlap": false`` when overlap off
was not slower than any candidate). ``load_tuned(path)`` reads a ``tuned.json`` back, refusing as bad
usage (one line naming the file and every problem) a missing, unreadable or broken file, one whose
fields have the wrong types (``_tuned_problems``: overrides ``key=value`` strings, ``env`` variable
names to strings or integers) and an NCCL file Megatron-Core could not use (``_check_nccl_file``).
``apply_tuned(cfg, path)`` applies it to a recipe's config (after ``enable_ep_overlap``); ``bench
--tuned PATH`` re-measures it as the variant ``tuned``, its settings judged by the pipeline first.

No torch or Megatron import at module level.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..base.choices import DEEP_EP_BACKENDS, MEASURED_DISPATCHERS
from ..base.errors import UsageError
from ..base.sizes import INT64_MAX
from . import bench, results
from ..runtime.exits import release_stderr
from .bench import Variant
from .results import Shown, VariantResult, short_value
from .numerics import compare_losses
from .tables import num, pct, write_json

# ---- Megatron-Core's per-process-group NCCL options ---------------------------------------------
# megatron/core/parallel_state.py (0.19.2): initialize_model_parallel(nccl_communicator_config_path)
# reads the YAML with yaml.safe_load into {pg_name: {option: value}} and get_nccl_options(pg_name)
# turns one entry into torch's ProcessGroupNCCL.Options (config.max_ctas / min_ctas /
# cga_cluster_size / net_name, and is_high_priority_stream). Megatron-Bridge 0.6.2 passes
# cfg.dist.nccl_communicator_config_path (training/initialize.py). The names below are the ones
# parallel_state.py passes to get_nccl_options - not ProcessGroupCollection's attribute names
# (the expert data-parallel group is 'ep_dp' here, 'expt_dp' there).
NCCL_PG_NAMES = (
    "ep", "ep_tp", "tp_ep_mp", "tp_ep_pp", "tp_ep_gtp_remat_pp", "ep_dp", "intra_ep_dp", "ep_gtp_remat_dp",
    "expt_gtp_remat", "dp", "dp_cp", "intra_dp_cp", "cp", "hcp", "mp", "tp", "pp", "embd", "pos_embd",
    "tp_dp", "tp_dp_cp", "tp_cp", "gtp_remat", "gtp_remat_dp", "gtp_remat_dp_cp", "intra_dist_opt_instance",
)
_NCCL_OPTIONS = {"max_ctas": int, "min_ctas": int, "cga_cluster_size": int, "net_name": str,
                "is_high_priority_stream": bool}
_NCCL_CONFIG_OVERRIDE = "dist.nccl_communicator_config_path"
# RunSpec fields a knob may change, as the override a recipe applies (tuned.overrides)
_SPEC_AS_OVERRIDE = {"micro_batch_size": "train.micro_batch_size", "global_batch_size": "train.global_batch_size"}


def _check_nccl_config(cfg: dict) -> dict[str, dict[str, Any]]:
    """``{pg_name: {option: value}}`` validated against what Megatron-Core 0.19.2 reads."""
    if not isinstance(cfg, dict):
        raise UsageError("NCCL communicator config", cfg, "a mapping of process-group name -> options", "invalid")
    out: dict[str, dict[str, Any]] = {}
    for pg, opts in cfg.items():
        if pg not in NCCL_PG_NAMES:
            raise UsageError("NCCL process-group name", pg, list(NCCL_PG_NAMES))
        if not isinstance(opts, dict) or not opts:
            raise UsageError(f"NCCL options of {pg}", opts, f"a non-empty mapping of {sorted(_NCCL_OPTIONS)}", "invalid")
        for name, value in opts.items():
            kind = _NCCL_OPTIONS.get(name)
            if kind is None:
                raise UsageError(f"NCCL option of {pg}", name, sorted(_NCCL_OPTIONS))
            if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise UsageError(f"{pg}.{name}", value, "an integer >= 0", "invalid")
            if kind is bool and not isinstance(value, bool):
                raise UsageError(f"{pg}.{name}", value, (True, False), "invalid")
            if name == "net_name" and str(value).lower() not in ("ib", "socket"):
                raise UsageError(f"{pg}.net_name", value, ("IB", "socket"))
            if name in ("max_ctas", "min_ctas") and not 1 <= value <= 64:
                raise UsageError(f"{pg}.{name}", value, "1 to 64 (NCCL's channel limit)", "invalid")
            if name == "cga_cluster_size" and value > 8:
                raise UsageError(f"{pg}.cga_cluster_size", value, "0 to 8", "invalid")
        if "min_ctas" in opts and "max_ctas" in opts and opts["min_ctas"] > opts["max_ctas"]:
            raise UsageError(f"{pg}.min_ctas", opts["min_ctas"], f"<= max_ctas ({opts['max_ctas']})", "invalid")
        out[pg] = dict(opts)
    return out


def nccl_yaml(cfg: dict) -> str:
    """The YAML file ``dist.nccl_communicator_config_path`` points at (format of MCore 0.19.2)."""
    cfg = _check_nccl_config(cfg)

    def scalar(v: Any) -> str:
        return ("true" if v else "false") if isinstance(v, bool) else str(v)

    lines = ["# NCCL communicator options per Megatron-Core process group (mbridge-ep-overlap bench tune).",
             "# Read by megatron.core.parallel_state.initialize_model_parallel via get_nccl_options(pg_name);",
             "# set cfg.dist.nccl_communicator_config_path to this file."]
    for pg in sorted(cfg):
        lines.append(f"{pg}:")
        lines += [f"  {name}: {scalar(value)}" for name, value in sorted(cfg[pg].items())]
    return "\n".join(lines) + "\n"


# ---- candidates ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    """One option of one knob: RunSpec fields, Hydra-style overrides, launcher environment
    variables and per-process-group NCCL options it sets."""

    knob: str
    label: str
    spec: dict = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    nccl: dict = field(default_factory=dict)
    why: str = ""

    def __post_init__(self) -> None:
        if self.nccl:
            _check_nccl_config(self.nccl)
        if not re.fullmatch(r"[A-Za-z0-9_.=-]+", self.label):
            raise UsageError("knob option label", self.label, "letters, digits, _ . = -", "invalid")


@dataclass(frozen=True)
class Candidate:
    changes: tuple[Change, ...] = ()

    @property
    def name(self) -> str:
        return "+".join(["overlap", *(c.label for c in self.changes)])

    def with_change(self, change: Change) -> "Candidate":
        kept = tuple(c for c in self.changes if c.knob != change.knob)
        return Candidate((*kept, change))

    def spec_changes(self) -> dict:
        out: dict = {}
        for c in self.changes:
            out.update(c.spec)
        return out

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for c in self.changes:
            out.update({str(k): str(v) for k, v in c.env.items()})
        return out

    def nccl(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for c in self.changes:
            for pg, opts in c.nccl.items():
                out.setdefault(pg, {}).update(opts)
        return out

    def overrides(self, nccl_path: Path | None = None) -> list[str]:
        """Every setting as ``key=value`` (RunSpec changes and environment variables included),
        the later of two values for one key winning; ``nccl_path``: where its NCCL YAML lies."""
        items: dict[str, str] = {}
        for c in self.changes:
            for name, value in c.spec.items():
                items[_SPEC_AS_OVERRIDE[name]] = str(value)
            for o in c.overrides:
                key, _, value = o.partition("=")
                items[key] = value
            for name, value in c.env.items():
                items[f"env_vars.{name}"] = str(value)
        if self.nccl():
            if nccl_path is None:
                raise ValueError("a candidate with NCCL options needs the path of its YAML file")
            items[_NCCL_CONFIG_OVERRIDE] = str(Path(nccl_path).resolve())
        return [f"{k}={v}" for k, v in items.items()]

    def variant(self, dispatcher: str, nccl_dir: Path) -> Variant:
        """The bench variant that runs this candidate (writes its NCCL YAML under ``nccl_dir``)."""
        path = None
        if self.nccl():
            nccl_dir.mkdir(parents=True, exist_ok=True)
            path = nccl_dir / f"{bench.run_name('nccl', self.name)}.yaml"
            path.write_text(nccl_yaml(self.nccl()))
        # spec changes go in as RunSpec fields (typed, flags at launch); overrides carry the rest
        spec_keys = {_SPEC_AS_OVERRIDE[k] for k in self.spec_changes()}
        overrides = tuple(o for o in self.overrides(path) if o.partition("=")[0] not in spec_keys)
        # the default-priority stream as the starting point (the historical baseline); the a2a_priority
        # knob turns it high with an override, applied after enable_ep_overlap
        return Variant({"ep_overlap": True, "dispatcher": dispatcher, "high_priority_a2a": False,
                        **self.spec_changes()}, self.env(), overrides=overrides)


# ---- knobs --------------------------------------------------------------------------------------
@dataclass
class Context:
    base: Any  # RunSpec of the shape (before any variant)
    dispatcher: str
    best: Candidate
    evidence: dict
    te: bool

    def micro_batch_size(self) -> int | None:
        return self.best.spec_changes().get("micro_batch_size", self.base.micro_batch_size)


def _hiprio(ctx: Context) -> list[Change] | str:
    return [Change("a2a_priority", "hiprio", overrides=("model.high_priority_a2a_comm_stream=true",),
                   why="CUDA high priority for the overlapped schedule's all-to-all stream")]


def _nccl_ep(ctx: Context) -> list[Change] | str:
    if ctx.dispatcher != "alltoall":
        return f"{ctx.dispatcher} moves tokens with its own kernels, not NCCL"
    low = Change("nccl_ep", "nccl.ep.max_ctas=4", nccl={"ep": {"max_ctas": 4}},
                 why="fewer SMs for the EP all-to-all: less contention with the GEMMs beside it")
    high = Change("nccl_ep", "nccl.ep.min_ctas=16", nccl={"ep": {"min_ctas": 16, "max_ctas": 32}},
                  why="more CTAs for the EP all-to-all: more copies in flight, a shorter all-to-all")
    cga = Change("nccl_ep", "nccl.ep.cga_cluster_size=1", nccl={"ep": {"cga_cluster_size": 1}},
                 why="no thread-block clusters: the all-to-all's CTAs start on any free SM beside a GEMM")
    ev = ctx.evidence
    contention, exposed = ev.get("contention_s") or 0.0, ev.get("exposed_inside_s") or 0.0
    return [low, cga, high] if contention > exposed else [high, cga, low]


def _flex_sms(ctx: Context) -> list[Change] | str:
    if ctx.dispatcher not in DEEP_EP_BACKENDS:
        return "only for the flex dispatchers (deepep, hybridep)"
    return [Change("flex_num_sms", f"flex_sms={n}", overrides=(f"model.moe_flex_dispatcher_num_sms={n}",),
                   why=f"{n} SMs for DeepEP/HybridEP dispatch and combine") for n in (16, 32)]


def _microbatches(ctx: Context) -> list[Change] | str:
    mbs = ctx.micro_batch_size()
    if mbs is None:
        return "the micro-batch size is the recipe's (give --micro-batch-size after --)"
    if mbs < 2 or mbs % 2:
        return f"micro-batch size {mbs} cannot be halved"
    return [Change("microbatches", f"mbs={mbs // 2}", spec={"micro_batch_size": mbs // 2},
                   why="twice the microbatches, same global batch: a shorter first forward / last backward")]


def _cdmc(ctx: Context) -> list[Change] | str:
    return [Change("cuda_device_max_connections", "cdmc=8", env={"CUDA_DEVICE_MAX_CONNECTIONS": "8"},
                   why="8 hardware queues (CUDA's default) instead of the plan's 32")]


def _permute_fusion(ctx: Context) -> list[Change] | str:
    if not ctx.te:
        return "needs Transformer Engine (not importable here)"
    return [Change("permute_fusion", "permute_fusion", overrides=("model.moe_permute_fusion=true",),
                   why="fused token permutation (TE): fewer kernels and host syncs around the all-to-all")]


def _delay_wgrad(ctx: Context) -> list[Change] | str:
    if not ctx.te:
        return "needs Transformer Engine (local layers' backward_dw is a no-op)"
    return [Change("delay_wgrad", "delay_wgrad", overrides=("comm_overlap.delay_wgrad_compute=true",),
                   why="expert weight gradients deferred to hide the dispatch's backward (TE grouped GEMM)")]


def _early_release(ctx: Context) -> list[Change] | str:
    return [Change("early_attn_release", "early_attn_release",
                   overrides=("model.ep_overlap_early_attn_memory_release=true",),
                   why="attention backward earlier in the overlapped schedule: less peak memory")]


KNOBS: dict[str, Callable[[Context], list[Change] | str]] = {
    "a2a_priority": _hiprio,
    "nccl_ep": _nccl_ep,
    "flex_num_sms": _flex_sms,
    "microbatches": _microbatches,
    "cuda_device_max_connections": _cdmc,
    "permute_fusion": _permute_fusion,
    "delay_wgrad": _delay_wgrad,
    "early_attn_release": _early_release,
}


def evidence(off: VariantResult | None, overlap: VariantResult | None) -> dict:
    """Seconds per step the overlap baseline loses, by cause, from its trace and off's."""
    e = (overlap.overlap_efficiency if overlap else None) or {}
    n = e.get("iterations") or 1
    ph = e.get("phases") or {}
    inside, outside = ph.get("inside") or {}, ph.get("outside") or {}
    off_e = (off.overlap_efficiency if off else None) or {}
    contention = None
    if e.get("compute_s") is not None and off_e.get("compute_s") is not None:
        contention = e["compute_s"] / n - off_e["compute_s"] / (off_e.get("iterations") or 1)
    edges = None
    if ph.get("first_forward_s") is not None and ph.get("last_backward_s") is not None:
        edges = ph["first_forward_s"] + ph["last_backward_s"]
    idle, _ = bench.idle_per_step(e)
    return {
        "contention_s": contention,
        "exposed_inside_s": inside.get("a2a_only", e["exposed_s"] / n if e.get("exposed_s") is not None else None),
        "exposed_outside_s": outside.get("a2a_only"),
        "edges_s": edges,
        "idle_inside_s": inside.get("idle", idle),
        "idle_s": idle,
        "outside_s": ph.get("outside_step_s"),
    }


def _addressable_s(knob: str, ev: dict) -> float:
    """What a knob can act on, in seconds per step, by the trace (the ordering heuristic)."""
    def g(name: str) -> float:
        return ev.get(name) or 0.0

    return {
        "a2a_priority": float("inf"),  # measured faster in every paired run so far: first
        "nccl_ep": max(g("contention_s"), g("exposed_inside_s")),
        "flex_num_sms": max(g("contention_s"), g("exposed_inside_s")),
        "microbatches": g("edges_s") / 2 if ev.get("edges_s") is not None else g("exposed_outside_s") / 2,
        "cuda_device_max_connections": g("idle_inside_s"),
        "delay_wgrad": float("inf") if ev.get("te") else 0.0,  # NVIDIA's perf recipes run it with TE
    }.get(knob, 0.0)


def order_knobs(names: list[str], ev: dict) -> list[str]:
    """The high-priority stream first, then by what each knob can act on (largest first), ties in
    ``KNOBS`` order; the memory knob (``early_attn_release``) last."""
    default = {n: i for i, n in enumerate(KNOBS)}
    last = [n for n in names if n == "early_attn_release"]
    rest = sorted((n for n in names if n != "early_attn_release"),
                  key=lambda n: (-_addressable_s(n, ev), default.get(n, len(default))))
    return rest + last


# ---- the search ---------------------------------------------------------------------------------
@dataclass
class Trial:
    name: str
    labels: list[str]
    result: VariantResult
    status: str = ""
    knob: str = ""
    cached: bool = False

    @property
    def qualified(self) -> bool:
        return self.status in ("ok", "baseline")


@dataclass
class Outcome:
    link: str
    out: Path
    trials: list[Trial]
    winner: Trial | None
    order: list[str]
    skipped: dict[str, str]
    stopped: str
    tuned: dict | None


def _request(recipe: str, nproc: int, shape: str, link: str, steps: int, warmup: int, profile: int,
             extra: list[str], dispatcher: str) -> dict:
    return {"recipe": recipe, "nproc": nproc, "shape": shape, "link": link, "steps": steps, "warmup": warmup,
            "profile": profile, "extra": list(extra), "dispatcher": dispatcher, "host": socket.gethostname()}


def _load_state(out: Path, request: dict) -> tuple[dict[str, VariantResult], str]:
    path = out / "tune.json"
    if not path.exists():
        return {}, ""
    try:
        state = json.loads(path.read_text())
        if state.get("request") != request:
            return {}, f"{path}: another request or host; measuring afresh"
        cache = {}
        for t in state.get("trials", []):
            fields = {f.name for f in dataclasses.fields(VariantResult)}
            # each row checked as bench report checks results.json (results.RowError otherwise)
            cache[t["name"]] = results.result_from_row({k: v for k, v in dict(t["result"]).items() if k in fields})
        return cache, f"{path}: resuming, {len(cache)} runs already measured"
    except results.RowError as e:
        return {}, f"{path}: unreadable (a run's {e}); measuring afresh"
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        return {}, f"{path}: unreadable ({type(e).__name__}); measuring afresh"


def _save_state(out: Path, request: dict, trials: list[Trial]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {"request": request,
             "trials": [{"name": t.name, "labels": t.labels, "knob": t.knob, "status": t.status,
                         "result": t.result.__dict__} for t in trials]}
    (out / "tune.json").write_text(json.dumps(state, indent=2, default=str))
    write_json([t.result for t in trials], out)


def judge(trial: Trial, off: Trial | None, mem_limit_gib: float | None) -> str:
    """'ok', 'baseline', 'failed: ...' or 'disqualified: ...' (losses against off, peak memory)."""
    r = trial.result
    if not r.ok:
        return f"failed: {r.error}"
    if r.median_s is None:
        return "failed: no steady-window step time"
    if trial.name == "off":
        return "baseline"
    if off is None or not off.result.ok:
        return "failed: no overlap-off run to compare losses with"
    parity = compare_losses(off.result.losses, r.losses, skipped=set(r.skipped))
    if not parity.ok:
        return "disqualified: losses differ from off (" + "; ".join(parity.problems[:2]) + ")"
    if mem_limit_gib is not None and r.peak_gib is not None and r.peak_gib > mem_limit_gib:
        return f"disqualified: peak {r.peak_gib:.2f} GiB > {mem_limit_gib:.2f} GiB (overlap's peak + tolerance)"
    return "ok"


def _estimate_run_s(durations: list[float]) -> float | None:
    """The next run's wall time: the mean of the runs so far plus 10%, at least the last one."""
    if not durations:
        return None
    return max(statistics.mean(durations) * 1.1, durations[-1])


def tune(recipe: str, nproc: int, shape: str, link: str, out: Path, budget_s: float, *, steps: int = 8,
         warmup: int = 3, profile: int = 2, extra: list[str] | None = None, dispatcher: str = "alltoall",
         mem_tolerance: float = 0.02, min_gain: float = 0.005, timeout_s: float = 300,
         knobs: dict[str, Callable[[Context], list[Change] | str]] | None = None,
         clock: Callable[[], float] = time.monotonic, te: bool | None = None) -> Outcome:
    extra = list(extra or [])
    bench.validate_request(recipe, nproc, ["off", "overlap"], [link], steps, warmup, profile)
    if not isinstance(budget_s, (int, float)) or budget_s <= 0:
        raise UsageError("--budget", budget_s, "seconds > 0", "invalid")
    if dispatcher not in MEASURED_DISPATCHERS:
        raise UsageError("--dispatcher", dispatcher, MEASURED_DISPATCHERS)
    for what, value in (("--mem-tolerance", mem_tolerance), ("--min-gain", min_gain)):
        if not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise UsageError(what, value, "a fraction in [0, 1)", "invalid")
    if dispatcher != "alltoall":
        why = bench.available_variants().get(dispatcher, "")
        if why:
            raise UsageError("--dispatcher", dispatcher, f"a dispatcher that runs here ({why})", "unavailable")
    knobs = dict(KNOBS if knobs is None else knobs)
    if te is None:
        from ..target.probe import te_version_here

        te = bool(te_version_here())
    base = bench.shape_spec(recipe, shape, steps, extra)
    baselines = {"off": Variant({"ep_overlap": False}), "overlap": Candidate().variant(dispatcher, out / "nccl")}
    bench.check_jobs(base, baselines, [link], nproc)  # bad usage (2) or refused (1) before the first job starts
    bench.require_gpus(nproc, "bench tune")  # after the request's own checks, before any job or file
    bench.output_folder(out)
    release_stderr()  # jobs start: what the libraries printed so far is shown, nothing more is held
    t0 = clock()
    request = _request(recipe, nproc, shape, link, steps, warmup, profile, extra, dispatcher)
    cache, note = _load_state(out, request)
    if note:
        print(f"tune: {note}", flush=True)
    trials: list[Trial] = []
    durations = [r.run_s for r in cache.values() if r.run_s]
    off_trial: Trial | None = None
    mem_limit: float | None = None

    def measure(name: str, labels: list[str], variant: Variant, knob: str, mandatory: bool) -> Trial | None:
        """A trial from the cache, or a real run; None when the budget has no room for it."""
        if name in cache:
            trial = Trial(name, labels, cache[name], knob=knob, cached=True)
        else:
            estimate = _estimate_run_s(durations)
            left = budget_s - (clock() - t0)
            if not mandatory and estimate is not None and estimate > left:
                return None
            run_timeout = timeout_s if estimate is None else min(timeout_s, max(2 * estimate, 120.0))
            print(f"tune: {link}: running {name}" + (f" (about {estimate:.0f} s, {left:.0f} s of budget left)"
                                                     if estimate else ""), flush=True)
            r = bench.run_variant(base, name, variant, link, out, nproc=nproc, steps=steps, warmup=warmup,
                                  profile=profile, timeout_s=run_timeout)
            if r.run_s:
                durations.append(r.run_s)
            trial = Trial(name, labels, r, knob=knob)
        trial.status = judge(trial, off_trial, mem_limit)
        trial.result.disqualified = trial.status if trial.status.startswith("disqualified") else ""
        trials.append(trial)
        _save_state(out, request, trials)
        print(f"tune: {link}: {_line(trial, off_trial)}", flush=True)
        return trial

    off_trial = measure("off", [], baselines["off"], "baseline", True)
    stopped, skipped, order = "", {}, []
    if off_trial.status != "baseline":
        stopped = f"overlap off failed ({off_trial.status}): nothing to compare with"
        return _finish(out, link, request, trials, None, [], {}, stopped, base, dispatcher, t0, clock)
    overlap = measure("overlap", [], baselines["overlap"], "baseline", True)
    if overlap.status != "ok":
        stopped = f"the overlap baseline did not qualify ({overlap.status})"
        return _finish(out, link, request, trials, None, [], {}, stopped, base, dispatcher, t0, clock)
    mem_limit = overlap.result.peak_gib * (1 + mem_tolerance) if overlap.result.peak_gib else None
    best, best_trial = Candidate(), overlap
    bench.compare_to_baseline([off_trial.result, overlap.result])
    ev = {**evidence(off_trial.result, overlap.result), "te": te}
    order = order_knobs(list(knobs), ev)
    print(f"tune: {link}: evidence per step (s): {_fmt_evidence(ev)}; knob order: {', '.join(order)}", flush=True)
    for knob in order:
        ctx = Context(base=base, dispatcher=dispatcher, best=best, evidence=ev, te=te)
        options = knobs[knob](ctx)
        if isinstance(options, str):
            skipped[knob] = options
            continue
        tried: list[tuple[Candidate, Trial]] = []
        for change in options:
            cand = best.with_change(change)
            trial = measure(cand.name, [c.label for c in cand.changes], cand.variant(dispatcher, out / "nccl"),
                            knob, False)
            if trial is None:
                stopped = f"budget: the next run ({cand.name}) would not fit in {budget_s:.0f} s"
                break
            tried.append((cand, trial))
        good = [(c, t) for c, t in tried if t.qualified]
        if good:
            cand, trial = min(good, key=lambda ct: ct[1].result.median_s)
            if trial.result.median_s < best_trial.result.median_s * (1 - min_gain):
                best, best_trial = cand, trial
        if stopped:
            break
    winner = best_trial
    if off_trial.result.median_s <= best_trial.result.median_s:
        winner = off_trial  # never recommend overlap where it was measured slower
    return _finish(out, link, request, trials, winner, order, skipped, stopped, base, dispatcher, t0, clock,
                   best=best if winner is not off_trial else None)


def _fmt_evidence(ev: dict) -> str:
    return ", ".join(f"{k.removesuffix('_s')} {v:.3f}" for k, v in ev.items() if v is not None) or "no profile"


def _line(t: Trial, off: Trial | None) -> str:
    r = t.result
    if not r.ok or r.median_s is None:
        return f"{t.name}: {t.status}"
    vs = f", {off.result.median_s / r.median_s:.3f}x vs off" if off and off.result.median_s and t is not off else ""
    return f"{t.name}: {r.median_s:.3f} s/step{vs}, peak {num(r.peak_gib, '.1f')} GiB - {t.status}" + (" (cached)" if t.cached else "")


def _finish(out: Path, link: str, request: dict, trials: list[Trial], winner: Trial | None, order: list[str],
            skipped: dict[str, str], stopped: str, base: Any, dispatcher: str, t0: float, clock: Callable[[], float],
            best: Candidate | None = None) -> Outcome:
    rows = [t.result for t in trials]
    bench.compare_to_baseline(rows)
    tuned = None
    if winner is not None:
        tuned = _write_tuned(out, request, trials, winner, best, dispatcher)
    text = ranking(trials, winner)
    doc = [f"# bench tune: {request['recipe']}, shape {request['shape']}, link {link}, {request['nproc']} GPUs",
           "", f"Host {request['host']}; {len(trials)} runs ({sum(1 for t in trials if not t.cached)} in this "
           f"invocation, {clock() - t0:.0f} s). Steps {request['steps']}, warmup {request['warmup']}, "
           f"profile {request['profile']}.", ""]
    if order:
        off = next((t for t in trials if t.name == "off"), None)
        ov = next((t for t in trials if t.name == "overlap"), None)
        ev = evidence(off.result if off else None, ov.result if ov else None)
        doc += [f"Evidence from the overlap baseline, seconds per step: {_fmt_evidence(ev)}.",
                f"Knob order: {', '.join(order)}."]
    doc += [f"Not applicable: {k} ({v})." for k, v in skipped.items()]
    doc += ([f"Stopped: {stopped}."] if stopped else ["Every applicable knob was measured."]) + ["", text, ""]
    if tuned:
        doc += ["Winner: " + tuned["advice"], "", "Apply: `tuned.overrides` (trailing run_script.py arguments or "
                "`plan --set`), `tuned.json` (`tune.apply_tuned(cfg, path)`); re-measure: "
                "`bench run --tuned tuned.json --variants off,overlap:hiprio,tuned`.", ""]
    doc.append(bench.summary_line(rows))
    (out / "tune.md").write_text("\n".join(doc) + "\n")
    bench.write_outputs(rows, out, f"{request['recipe']}, {request['nproc']} GPUs, shape {request['shape']}, tune")
    print(text)
    if tuned:
        print("tune: winner: " + tuned["advice"])
        print(f"tune: wrote {out / 'tuned.json'} and {out / 'tuned.overrides'}")
    if stopped:
        print(f"tune: stopped: {stopped}")
    return Outcome(link, out, trials, winner, order, skipped, stopped, tuned)


def ranking(trials: list[Trial], winner: Trial | None) -> str:
    """The ranking table: qualified runs by median step time, then the rest."""
    off = next((t for t in trials if t.name == "off"), None)
    ov = next((t for t in trials if t.name == "overlap"), None)
    lines = ["| rank | candidate | median step s | vs off | vs overlap | share of possible gain (vs off's ideal) | "
             "A2A hidden | idle s/step | peak GiB | status |", "|---|---|---|---|---|---|---|---|---|---|"]
    ok = sorted((t for t in trials if t.qualified), key=lambda t: t.result.median_s)
    rest = [t for t in trials if not t.qualified]
    for i, t in enumerate(ok + rest):
        r = t.result
        rank = str(i + 1) if t.qualified else "-"
        mark = " **(winner)**" if winner is t else ""
        if not r.ok or r.median_s is None:
            lines.append(f"| {rank} | {t.name}{mark} | - | - | - | - | - | - | - | {t.status} |")
            continue
        e = bench.efficiency(r)
        vs_off = f"{off.result.median_s / r.median_s:.3f}x" if off and off.result.median_s else "-"
        vs_ov = f"{ov.result.median_s / r.median_s:.3f}x" if ov and ov.result.ok and ov.result.median_s else "-"
        share = "-" if r.share_of_gain is None else f"{r.share_of_gain:.0%} ({pct(r.share_of_gain_off_ideal)})"
        idle = "-" if r.idle_step_s is None else f"{r.idle_step_s:.3f}"
        hidden = f"{e['hidden_fraction']:.0%}" if e else "-"
        lines.append(f"| {rank} | {t.name}{mark} | {r.median_s:.3f} | {vs_off} | {vs_ov} | {share} | {hidden} | "
                     f"{idle} | {num(r.peak_gib, '.1f')} | {t.status}{' (cached)' if t.cached else ''} |")
    return "\n".join(lines)


def _write_tuned(out: Path, request: dict, trials: list[Trial], winner: Trial, best: Candidate | None,
                dispatcher: str) -> dict:
    """tuned.json, tuned.overrides and (NCCL options) nccl_communicator.yaml for the winner."""
    off = next(t for t in trials if t.name == "off")
    ov = next((t for t in trials if t.name == "overlap"), None)
    r = winner.result
    overlap_on = winner is not off
    nccl = best.nccl() if (overlap_on and best) else {}
    nccl_path = out / "nccl_communicator.yaml"
    if nccl:
        nccl_path.write_text(nccl_yaml(nccl))
    elif nccl_path.exists():
        nccl_path.unlink()
    overrides = best.overrides(nccl_path if nccl else None) if (overlap_on and best) else []
    env = best.env() if (overlap_on and best) else {}
    e = bench.efficiency(r)
    parity = compare_losses(off.result.losses, r.losses, skipped=set(r.skipped))
    measured = {
        "off_s": off.result.median_s,
        "overlap_s": ov.result.median_s if ov and ov.result.ok else None,
        "tuned_s": r.median_s,
        "speedup_vs_off": off.result.median_s / r.median_s if r.median_s else None,
        "share_of_gain": r.share_of_gain,
        "share_of_gain_off_ideal": r.share_of_gain_off_ideal,
        "ideal_step_s": e.get("ideal_step_s"),
        "hidden_fraction": e.get("hidden_fraction"),
        "idle_step_s": r.idle_step_s,
        "peak_gib": r.peak_gib,
        "off_peak_gib": off.result.peak_gib,
        "overlap_peak_gib": ov.result.peak_gib if ov and ov.result.ok else None,
        "peak_vs_off": r.peak_vs_off,
        "loss_max_rel_diff": parity.max_rel_diff,
        "runs": len(trials),
        "steps": request["steps"], "warmup": request["warmup"], "profile": request["profile"],
        "host": request["host"],
        "shape": bench.shape_label(r.finalized),
    }
    if overlap_on:
        what = ", ".join(winner.labels) or "plain overlap"
        advice = (f"measured on {request['host']} ({request['nproc']} GPUs, {request['link']} link, "
                  f"{measured['shape']}): overlap off {measured['off_s']:.3f} s/step, "
                  + (f"overlap {measured['overlap_s']:.3f} s, " if measured["overlap_s"] else "")
                  + f"tuned overlap ({what}) {r.median_s:.3f} s = {measured['speedup_vs_off']:.3f}x vs off"
                  + (f", {r.share_of_gain:.0%} of the possible gain (ideal {e['ideal_step_s']:.3f} s)"
                     if r.share_of_gain is not None and e else "")
                  + (f", peak {r.peak_gib:.1f} GiB ({r.peak_vs_off:+.0%} vs off)" if r.peak_vs_off is not None else "")
                  + f", losses match (max rel diff {parity.max_rel_diff:.1e})")
    else:
        advice = (f"measured on {request['host']} ({request['link']} link, {measured['shape']}): overlap off "
                  f"{measured['off_s']:.3f} s/step was not slower than the best overlap candidate: keep overlap off")
    tuned = {
        "recipe": request["recipe"], "shape": request["shape"], "link": request["link"], "nproc": request["nproc"],
        "extra": request["extra"], "dispatcher": dispatcher, "ep_overlap": overlap_on,
        "changes": list(winner.labels) if overlap_on else [],
        "overrides": overrides, "env": env, "nccl_communicator": nccl or None,
        "measured": measured, "advice": advice,
    }
    (out / "tuned.json").write_text(json.dumps(tuned, indent=2) + "\n")
    # key=value lines only, so that `$(cat tuned.overrides)` is a valid argument list (empty: overlap off won;
    # tuned.json says so and why)
    (out / "tuned.overrides").write_text("".join(f"{o}\n" for o in overrides))
    return tuned


def tune_links(recipe: str, nproc: int, shape: str, links: list[str], out: Path, budget_s: float,
               **kwargs: Any) -> list[Outcome]:
    """``tune`` for each link in turn, the remaining budget shared evenly (``out/<link>`` for more than one)."""
    for link in links:
        if link not in bench.LINKS:
            raise UsageError("link", link, sorted(bench.LINKS))
    clock = kwargs.get("clock", time.monotonic)
    t0, outcomes = clock(), []
    for i, link in enumerate(links):
        share = (budget_s - (clock() - t0)) / (len(links) - i)
        folder = out if len(links) == 1 else out / link
        outcomes.append(tune(recipe, nproc, shape, link, folder, max(share, 1.0), **kwargs))
    return outcomes


# ---- applying a tuned result --------------------------------------------------------------------
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _tuned_problems(t: Any) -> list[str]:
    """Every way ``t`` (a parsed tuned.json) differs from what ``bench tune`` writes, as the
    launchers need it: ``ep_overlap`` a boolean, ``overrides`` a list of ``key=value`` strings,
    ``env`` a mapping of variable names to strings or integers (what a process environment can
    hold). What the values mean is judged by the pipeline (``bench.check_jobs``, ``apply_tuned``)."""
    if not isinstance(t, dict):
        return [f"a JSON object, not {type(t).__name__}"]
    problems = []
    if not isinstance(t.get("ep_overlap"), bool):
        problems.append(f"ep_overlap = {short_value(t.get('ep_overlap'))}: true or false")
    overrides = t.get("overrides")
    if not isinstance(overrides, list):
        problems.append(f"overrides = {short_value(overrides)}: a list of key=value strings")
    else:
        problems += [f"overrides[{i}] = {short_value(o)}: a key=value string" for i, o in enumerate(overrides)
                     if not isinstance(o, str) or "=" not in o or "\0" in o]
    env = t.get("env")
    if not isinstance(env, dict):
        problems.append(f"env = {short_value(env)}: a mapping of variable name -> value")
    else:
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name):
                problems.append(f"env name {short_value(name)}: letters, digits and _, not starting with a digit")
            if not ((isinstance(value, str) and "\0" not in value)
                    or (isinstance(value, int) and not isinstance(value, bool) and abs(value) <= INT64_MAX)):
                problems.append(f"env {short_value(name)} = {short_value(value)}: a string or an integer")
    return problems


def load_tuned(path: Path) -> dict:
    """A ``tuned.json`` written by ``bench tune`` (UsageError naming the file and every problem
    otherwise), its ``env`` values as strings; the NCCL file its overrides name is checked as
    Megatron-Core will read it (``_check_nccl_file``)."""
    try:
        t = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        detail = (str(e).splitlines() or [""])[0]
        raise UsageError("tuned file", str(path), f"a tuned.json written by bench tune ({type(e).__name__}"
                         + (f": {detail})" if detail else ")"), "unreadable") from None
    problems = _tuned_problems(t)
    if problems:
        raise UsageError("tuned file", str(path), f"a tuned.json written by bench tune ({'; '.join(problems)})",
                         "invalid")
    t.setdefault("dispatcher", "alltoall")
    t["env"] = {name: str(value) for name, value in t["env"].items()}
    # the NCCL file travels beside tuned.json: when the recorded absolute path is gone (another
    # checkout or machine), point at the copy next to this tuned.json
    sibling = Path(path).resolve().parent / "nccl_communicator.yaml"
    fixed = []
    for o in t["overrides"]:
        key, _, value = o.partition("=")
        if key == _NCCL_CONFIG_OVERRIDE:
            if not Path(value).exists():
                if not sibling.exists():
                    raise UsageError("tuned file", str(path), f"its NCCL file beside it ({value} and {sibling} are "
                                     "missing)", "incomplete")
                value = str(sibling)
                o = f"{key}={value}"
            _check_nccl_file(Path(value))
        fixed.append(o)
    t["overrides"] = fixed
    return t


def _check_nccl_file(path: Path) -> dict[str, dict[str, Any]]:
    """The YAML ``dist.nccl_communicator_config_path`` names, read as Megatron-Core reads it
    (``yaml.safe_load``) and checked (``_check_nccl_config``); UsageError naming the file otherwise."""
    import yaml

    try:
        cfg = yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as e:
        raise UsageError("NCCL communicator file", str(path), f"a YAML mapping of process-group name -> options "
                         f"({type(e).__name__})", "unreadable") from None
    try:
        return _check_nccl_config(cfg)
    except UsageError as e:
        raise UsageError(f"NCCL communicator file {str(path)!r}: {e.what}", Shown(e.value), e.allowed,
                         e.problem) from None


def apply_tuned(cfg: Any, path: Path) -> dict:
    """Apply a ``tuned.json`` to a recipe's ``ConfigContainer`` (after ``enable_ep_overlap``): its
    overrides through Megatron-Bridge's override machinery, its environment into ``cfg.env_vars``
    (exported by MB at start-up and by ``launch_slurm.py``); overlap off when off won."""
    from ..pipeline import apply_overrides

    t = load_tuned(path)
    if not t["ep_overlap"]:
        from ..core.enable import disable_ep_overlap

        disable_ep_overlap(cfg)
        return t
    apply_overrides(cfg, tuple(o for o in t["overrides"] if not o.startswith("env_vars.")))
    if cfg.env_vars is None:
        cfg.env_vars = {}
    cfg.env_vars.update({str(k): str(v) for k, v in t["env"].items()})
    return t


__all__ = ["tune", "tune_links", "Change", "Candidate", "Context", "KNOBS", "order_knobs", "evidence", "nccl_yaml",
           "load_tuned", "apply_tuned", "ranking", "NCCL_PG_NAMES"]


def load_tuned_variant(path: Path) -> Variant:
    """The variant ``tuned`` from a ``tuned.json`` written by ``bench tune`` (``tune.load_tuned``
    checks the file; ``check_jobs`` judges its settings before anything is launched)."""
    t = load_tuned(path)
    changes = {"ep_overlap": True, "dispatcher": t["dispatcher"]} if t["ep_overlap"] else {"ep_overlap": False}
    return Variant(changes, dict(t["env"]), overrides=tuple(t["overrides"]), source=f"tuned file {path}")
