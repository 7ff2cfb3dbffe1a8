#!/usr/bin/env python3
"""Measurements the step-time and memory model is calibrated and checked on (``measure_predict.sh``).

Contract
--------
``python scripts/gpu/measure_predict.py gemm OUT/gemm.json`` times Transformer Engine's dense GEMMs
(``te.Linear``), grouped GEMMs (``te.GroupedLinear``) and attention (``te.DotProductAttention``,
seq 4096, causal) forward and backward with CUDA events, at the layer shapes of Qwen3-30B-A3B,
Qwen3-235B-A22B, DeepSeek-V3 and GPT-OSS-120B (their local experts at the EP of NVIDIA's perf recipes; GPT-OSS's
attention with and without its 128-token sliding window and its learnable softmax offsets), in BF16 and
every FP8-class recipe this GPU supports (delayed and tensorwise FP8, blockwise FP8, MXFP8, NVFP4);
a recipe the GPU lacks is one row with ``status: "unsupported"`` and TE's reason. Without TE it writes
one row saying so and exits 0.

``--models NAME...`` (gemm, attention) times only those layer shapes of ``MODELS``.

``python scripts/gpu/measure_predict.py attention OUT/attention.json`` times ``te.DotProductAttention``
(seq 4096, causal, the same three layer shapes) forward and backward in BF16 and with FP8 attention
(``fp8_dpa=True`` under each FP8-class recipe TE runs on this GPU: on compute capability 9.0 TE 2.18
runs FP8 fused attention under delayed scaling only); every row records the backend TE chose (its
"Running with ... backend" log line, ``NVTE_DEBUG=1``), so a row is never a silent BF16 fallback,
and a recipe TE has no FP8 attention backend for is a row with ``status: "unsupported"`` and TE's reason.

``python scripts/gpu/measure_predict.py memory OUT/memory.json [--runs DIR]`` launches the proxy
recipe (EP = 2, both ranks on GPU 0: ``EP_OVERLAP_SHARE_GPU=1``) with overlap off, overlap,
overlap + delayed wgrad, and overlap + early attention release, on the local layer stack and (where
TE imports) the TE stack, each with a hard timeout, and records each rank's own
``torch.cuda.max_memory_allocated`` (the evidence summary's ``peak_memory_gib_per_rank``).

Every row says how it was measured (``method``) and on what (``device``, ``versions``). ``read_rows``
is the one reader of these files (the tests parse the files with it). Exit 0 when the file was
written (rows may carry failures: a failure is data), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

KINDS = ("gemm", "attention", "memory")
SELECTED_MODELS: tuple[str, ...] = ()
"""``--models``: the layer shapes to time (empty: all of ``MODELS``)."""
SCHEMA = 1
WARMUP, ITERS = 3, 10
SEQ = 4096
PRECISIONS = ("bf16", "fp8_delayed", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "nvfp4")

# Layer shapes (target/hf_configs/*/config.json) and the EP of NVIDIA's perf recipes
# (megatron.bridge.perf_recipes: Qwen3-30B-A3B EP 8, Qwen3-235B-A22B EP 32, DeepSeek-V3 EP 64).
MODELS = {
    "qwen3_30b_a3b": dict(hidden=2048, heads=32, kv_heads=4, head_dim=128, v_head_dim=128,
                          expert_ffn=768, experts=128, topk=8, ep=8),
    "qwen3_235b_a22b": dict(hidden=4096, heads=64, kv_heads=4, head_dim=128, v_head_dim=128,
                            expert_ffn=1536, experts=128, topk=8, ep=32),
    # MLA: query/key head dim 128 (nope) + 64 (rope) = 192, value head dim 128.
    "deepseek_v3": dict(hidden=7168, heads=128, kv_heads=128, head_dim=192, v_head_dim=128,
                        expert_ffn=2048, experts=256, topk=8, ep=64),
    # GPT-OSS-120B (EP 8 in the H100 BF16 recipe): head dim 64, learnable softmax offsets (attention
    # sinks: MB's bridge sets softmax_type "learnable") and a 128-token sliding window on every other
    # layer (window_size (127, 0), window_attn_skip_freq 2); its attention rows time each variant.
    "gpt_oss_120b": dict(hidden=2880, heads=64, kv_heads=8, head_dim=64, v_head_dim=64,
                         expert_ffn=2880, experts=128, topk=4, ep=8, window=127, softmax_type="learnable"),
}
MEMORY_VARIANTS = {
    "off": ["--ep-overlap", "off"],
    "overlap": ["--ep-overlap", "on", "--dispatcher", "alltoall"],
    "overlap_delay_wgrad": ["--ep-overlap", "on", "--dispatcher", "alltoall", "--delay-wgrad", "on"],
    "overlap_early_attn_release": ["--ep-overlap", "on", "--dispatcher", "alltoall",
                                   "model.ep_overlap_early_attn_memory_release=true"],
}
MEMORY_STACKS = {"local": "qwen3_moe_proxy", "te": "qwen3_moe_proxy_te"}
MEMORY_SHAPE = dict(nproc=2, steps=4, micro_batch=2, microbatches=4)
RUN_TIMEOUT_S = int(os.environ.get("EP_OVERLAP_MEASURE_RUN_TIMEOUT", "200"))
PARALLEL_RUNS = int(os.environ.get("EP_OVERLAP_PARALLEL_RUNS", "3"))


# ---- the rows ---------------------------------------------------------------------------------------
def header(kind: str) -> dict:
    return {"schema": SCHEMA, "kind": kind, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": _device(), "versions": _versions()}


def read_rows(path: str | Path) -> dict:
    """The file ``main`` wrote, checked: ``{"schema", "kind", "date", "device", "versions", "rows"}``.
    Raises ``ValueError`` naming what is wrong (a missing key, an unknown kind, a row without status)."""
    data = json.loads(Path(path).read_text())
    for key in ("schema", "kind", "date", "device", "versions", "rows"):
        if key not in data:
            raise ValueError(f"{path}: key {key!r} missing (found {sorted(data)})")
    if data["schema"] != SCHEMA:
        raise ValueError(f"{path}: schema {data['schema']!r}, this reader reads {SCHEMA}")
    if data["kind"] not in KINDS:
        raise ValueError(f"{path}: kind {data['kind']!r}, expected one of {KINDS}")
    for i, row in enumerate(data["rows"]):
        if row.get("status") not in ("ok", "unsupported", "failed", "skipped"):
            raise ValueError(f"{path}: row {i} status {row.get('status')!r}, expected ok/unsupported/failed/skipped")
        if row["status"] == "ok":
            need = ("peak_gib_per_rank",) if data["kind"] == "memory" else ("seconds", "tflops")
            missing = [k for k in need if not isinstance(row.get(k), (int, float, list))]
            if missing:
                raise ValueError(f"{path}: ok row {i} lacks {missing}")
    return data


def _device() -> dict:
    try:
        import torch

        if not torch.cuda.is_available():
            return {"name": None, "why": "CUDA not available"}
        p = torch.cuda.get_device_properties(0)
        return {"name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 2),
                "sms": p.multi_processor_count}
    except Exception as e:  # noqa: BLE001 - a failure is data here
        return {"name": None, "why": f"{type(e).__name__}: {e}"}


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for name in ("torch", "transformer_engine", "megatron-core", "megatron-bridge"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# ---- GEMMs and attention ------------------------------------------------------------------------------
def gemm_shapes() -> list[dict]:
    """One entry per (model, op): dense attention projections at SEQ tokens, the local experts' grouped
    FC1 (SwiGLU: 2 x ffn) and FC2 at SEQ x topk routed tokens spread evenly over the EP ranks' experts."""
    out = []
    for model, m in MODELS.items():
        local = m["experts"] // m["ep"]
        routed = SEQ * m["topk"]  # tokens this rank's experts see per microbatch of SEQ tokens (even routing)
        qkv = (m["heads"] * m["head_dim"] + m["kv_heads"] * (m["head_dim"] + m["v_head_dim"]))
        out += [
            dict(model=model, op="linear_qkv", tokens=SEQ, in_features=m["hidden"], out_features=qkv),
            dict(model=model, op="linear_proj", tokens=SEQ, in_features=m["heads"] * m["v_head_dim"],
                 out_features=m["hidden"]),
            dict(model=model, op="grouped_fc1", tokens=routed, in_features=m["hidden"],
                 out_features=2 * m["expert_ffn"], groups=local),
            dict(model=model, op="grouped_fc2", tokens=routed, in_features=m["expert_ffn"],
                 out_features=m["hidden"], groups=local),
        ]
        attention = dict(model=model, op="attention", tokens=SEQ, heads=m["heads"], kv_heads=m["kv_heads"],
                         head_dim=m["head_dim"], v_head_dim=m["v_head_dim"])
        if "window" not in m and "softmax_type" not in m:
            out.append(attention)
            continue
        for window in (None, m.get("window")) if m.get("window") else (None,):
            for softmax in ("vanilla", m.get("softmax_type", "vanilla")) if m.get("softmax_type") else ("vanilla",):
                out.append({**attention, "window": window, "softmax_type": softmax})
    return [s for s in out if not SELECTED_MODELS or s["model"] in SELECTED_MODELS]


def _recipes(te_recipe) -> dict:
    """Precision -> a TE recipe factory (None for BF16); a recipe class TE lacks is left out."""
    made = {"bf16": None}
    table = {"fp8_delayed": ("DelayedScaling", {}), "fp8_tensorwise": ("Float8CurrentScaling", {}),
             "fp8_blockwise": ("Float8BlockScaling", {}), "mxfp8": ("MXFP8BlockScaling", {}),
             "nvfp4": ("NVFP4BlockScaling", {})}
    for precision, (cls, kw) in table.items():
        if hasattr(te_recipe, cls):
            made[precision] = (cls, kw)
    return made


def _support(precision: str) -> tuple[bool, str]:
    """Whether this GPU runs ``precision`` in TE, and TE's reason when not."""
    if precision == "bf16":
        return True, ""
    checks = {"fp8_delayed": "check_fp8_support", "fp8_tensorwise": "check_fp8_support",
              "fp8_blockwise": "check_fp8_block_scaling_support", "mxfp8": "check_mxfp8_support",
              "nvfp4": "check_nvfp4_support"}
    for modname in ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8"):
        try:
            mod = __import__(modname, fromlist=["x"])
        except Exception:  # noqa: BLE001 - the module moved between TE versions
            continue
        fn = getattr(mod, checks[precision], None)
        if fn is not None:
            ok, why = fn()
            return bool(ok), str(why or "")
    return False, f"TE has no {checks[precision]}()"


def _autocast(te, recipe):
    if recipe is None:
        import contextlib

        return contextlib.nullcontext()
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)


def _time(fn, torch) -> float:
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(ITERS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _flops(shape: dict) -> float:
    """Forward FLOPs of the op (backward = 2x: dgrad + wgrad)."""
    if shape["op"] == "attention":
        # causal: the (query, key) pairs at or before each query; a sliding window of w keys before
        # each query keeps min(q + 1, w + 1) of them (MCore window_size (w, 0))
        n, w = shape["tokens"], shape.get("window")
        pairs = n * (n + 1) / 2 if w is None else sum(min(q + 1, w + 1) for q in range(n))
        return 2 * pairs * shape["heads"] * (shape["head_dim"] + shape["v_head_dim"])
    return 2 * shape["tokens"] * shape["in_features"] * shape["out_features"]


def _measure(te, torch, shape: dict, recipe, precision: str, fp8_attention: bool = False) -> list[dict]:
    dev = "cuda"
    if shape["op"] == "attention":
        if precision != "bf16" and not fp8_attention:
            return []  # the GEMM kind times attention in BF16 only; the attention kind times FP8 attention
        attn = te.DotProductAttention(shape["heads"], (shape["head_dim"], shape["v_head_dim"])
                                      if shape["head_dim"] != shape["v_head_dim"] else shape["head_dim"],
                                      num_gqa_groups=shape["kv_heads"], attn_mask_type="causal",
                                      qkv_format="sbhd", attention_dropout=0.0,
                                      **({"window_size": (shape["window"], 0)} if shape.get("window") else {}),
                                      **({"softmax_type": shape["softmax_type"]}
                                         if shape.get("softmax_type", "vanilla") != "vanilla" else {}))
        attn = attn.to(dev)
        q = torch.randn(shape["tokens"], 1, shape["heads"], shape["head_dim"], device=dev, dtype=torch.bfloat16,
                        requires_grad=True)
        k = torch.randn(shape["tokens"], 1, shape["kv_heads"], shape["head_dim"], device=dev, dtype=torch.bfloat16,
                        requires_grad=True)
        v = torch.randn(shape["tokens"], 1, shape["kv_heads"], shape["v_head_dim"], device=dev, dtype=torch.bfloat16,
                        requires_grad=True)
        rc = recipe if fp8_attention else None

        def fwd():
            with _autocast(te, rc):
                return attn(q, k, v)

        out = fwd()
        grad = torch.randn_like(out)

        def bwd():
            with _autocast(te, rc):
                y = attn(q, k, v)
            return torch.autograd.grad(y, (q, k, v), grad)
    else:
        groups = shape.get("groups")
        if groups:
            layer = te.GroupedLinear(groups, shape["in_features"], shape["out_features"], bias=False,
                                     params_dtype=torch.bfloat16, device=dev)
            base, rest = divmod(shape["tokens"], groups)
            splits = [base + (1 if i < rest else 0) for i in range(groups)]
            call = lambda x: layer(x, splits)  # noqa: E731
        else:
            layer = te.Linear(shape["in_features"], shape["out_features"], bias=False,
                              params_dtype=torch.bfloat16, device=dev)
            call = layer
        x = torch.randn(shape["tokens"], shape["in_features"], device=dev, dtype=torch.bfloat16, requires_grad=True)

        def fwd():
            with _autocast(te, recipe):
                return call(x)

        out = fwd()
        grad = torch.randn_like(out)

        def bwd():
            with _autocast(te, recipe):
                y = call(x)
            y.backward(grad)

    flops = _flops(shape)
    t_fwd = _time(fwd, torch)
    t_all = _time(bwd, torch)
    t_bwd = max(t_all - t_fwd, 1e-9) if shape["op"] != "attention" else max(t_all - t_fwd, 1e-9)
    rows = []
    for direction, secs, f in (("forward", t_fwd, flops), ("backward", t_bwd, 2 * flops)):
        rows.append({**shape, "precision": precision, "direction": direction, "status": "ok",
                     "seconds": secs, "tflops": f / secs / 1e12, "flops": f})
    return rows


ATTENTION_PRECISIONS = ("bf16", "fp8_delayed", "fp8_tensorwise", "mxfp8")
"""BF16 and the recipes TE 2.18 has an FP8 fused-attention path for (``attention/dot_product_attention/utils.py``:
delayed scaling on any FP8 GPU, current scaling and MXFP8 from compute capability 10.0)."""


class _BackendLog:
    """Collects TE's "Running with ... backend" lines (logger ``DotProductAttention``, INFO with
    ``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=1``, set before TE is imported) and its "Disabling ..." reasons."""

    def __init__(self) -> None:
        import logging

        self.lines: list[str] = []
        outer = self

        class H(logging.Handler):
            def emit(self, record):  # noqa: D401 - logging API
                outer.lines.append(record.getMessage())

        self.handler = H(level=logging.DEBUG)
        for name in ("DotProductAttention", "transformer_engine.pytorch.attention.dot_product_attention.utils"):
            logging.getLogger(name).addHandler(self.handler)

    def take(self) -> tuple[str, list[str]]:
        lines, self.lines = self.lines, []
        chosen = [x for x in lines if x.startswith("Running with")]
        return (chosen[-1] if chosen else ""), [x for x in lines if x.startswith("Disabling")][:8]


def measure_attention() -> list[dict]:
    os.environ.setdefault("NVTE_DEBUG", "1")
    os.environ.setdefault("NVTE_DEBUG_LEVEL", "2")
    method = (f"te.DotProductAttention, sbhd, causal, batch 1, BF16 inputs; CUDA events around {ITERS} calls after "
              f"{WARMUP} warm-up calls, median; backward = (forward + backward) - forward; FP8 rows under "
              "te.autocast(recipe(fp8_dpa=True)), so TE quantizes Q, K, V and dO itself as Megatron-Core's "
              "fp8_dot_product_attention (without fp8_multi_head_attention) does")
    try:
        import torch
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe as te_recipe
    except Exception as e:  # noqa: BLE001 - without TE this part has nothing to time
        return [{"status": "skipped", "why": f"Transformer Engine does not import: {type(e).__name__}: {e}"}]
    log = _BackendLog()
    classes = {"fp8_delayed": "DelayedScaling", "fp8_tensorwise": "Float8CurrentScaling", "mxfp8": "MXFP8BlockScaling"}
    rows = []
    shapes = [s for s in gemm_shapes() if s["op"] == "attention"]
    for precision in ATTENTION_PRECISIONS:
        recipe = None
        if precision != "bf16":
            ok, why = _support(precision)
            if not ok or not hasattr(te_recipe, classes[precision]):
                rows.append({"precision": precision, "op": "attention", "status": "unsupported",
                             "why": why or f"this TE has no {classes[precision]}"})
                continue
            recipe = getattr(te_recipe, classes[precision])(fp8_dpa=True)
        for shape in shapes:
            try:
                got = _measure(te, torch, shape, recipe, precision, fp8_attention=recipe is not None)
                backend, disabled = log.take()
                if recipe is not None and "FusedAttention backend (sub-backend 2)" not in backend:
                    # cuDNN's FP8 fused attention is TE's sub-backend 2; anything else is not FP8 attention
                    rows.append({**shape, "precision": precision, "status": "unsupported",
                                 "why": f"TE ran {backend or 'no reported backend'} (not FP8 fused attention)",
                                 "backend": backend, "disabled": disabled})
                    continue
                rows += [{**r, "method": method, "backend": backend} for r in got]
            except Exception as e:  # noqa: BLE001 - one shape failing must not lose the others
                backend, disabled = log.take()
                rows.append({**shape, "precision": precision, "status": "failed",
                             "why": f"{type(e).__name__}: {str(e)[:300]}", "backend": backend, "disabled": disabled})
            finally:
                torch.cuda.empty_cache()
    return rows


def measure_gemms() -> list[dict]:
    method = (f"CUDA events around {ITERS} calls after {WARMUP} warm-up calls, median; backward = "
              "(forward + backward) - forward, so it includes the recomputed forward's quantization")
    try:
        import torch
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe as te_recipe
    except Exception as e:  # noqa: BLE001 - without TE this part has nothing to time
        return [{"status": "skipped", "why": f"Transformer Engine does not import: {type(e).__name__}: {e}"}]
    rows = []
    recipes = _recipes(te_recipe)
    for precision in PRECISIONS:
        if precision not in recipes:
            rows.append({"precision": precision, "status": "unsupported", "why": "this TE has no recipe class for it"})
            continue
        ok, why = _support(precision)
        if not ok:
            rows.append({"precision": precision, "status": "unsupported", "why": why or "TE says unsupported"})
            continue
        spec = recipes[precision]
        try:
            recipe = None if spec is None else getattr(te_recipe, spec[0])(**spec[1])
        except Exception as e:  # noqa: BLE001
            rows.append({"precision": precision, "status": "failed", "why": f"recipe: {type(e).__name__}: {e}"})
            continue
        for shape in gemm_shapes():
            try:
                got = _measure(te, torch, shape, recipe, precision)
                rows += [{**r, "method": method} for r in got]
            except Exception as e:  # noqa: BLE001 - one shape failing must not lose the others
                rows.append({**shape, "precision": precision, "status": "failed",
                             "why": f"{type(e).__name__}: {str(e)[:300]}"})
            finally:
                torch.cuda.empty_cache()
    return rows


# ---- peak memory ------------------------------------------------------------------------------------
def memory_runs(te_ok: bool) -> list[tuple[str, str, str, list[str]]]:
    """(name, stack, variant, run_script args) of every memory run; the TE stack only where TE imports.
    Local layers have no delayed wgrad (MCore's backward_dw is a no-op there and the rules refuse it),
    so that variant runs on TE layers only."""
    from mbridge_ep_overlap.lab.launch import proxy_args

    s = MEMORY_SHAPE
    out = []
    for stack, recipe in MEMORY_STACKS.items():
        if stack == "te" and not te_ok:
            continue
        for variant, args in MEMORY_VARIANTS.items():
            if stack == "local" and variant == "overlap_delay_wgrad":
                continue
            base = proxy_args(s["nproc"], s["steps"], s["micro_batch"], s["microbatches"], recipe=recipe)
            out.append((f"{stack}-{variant}", stack, variant, base + args))
    return out


def measure_memory(runs_dir: Path) -> list[dict]:
    from mbridge_ep_overlap.target.shims import real_te_available
    from mbridge_ep_overlap.lab import launch

    te_ok = real_te_available()
    method = ("each rank's own torch.cuda.max_memory_allocated() at the end of training (evidence summary "
              f"peak_memory_gib_per_rank), proxy recipe EP=2, {MEMORY_SHAPE}, both ranks on GPU 0 "
              "(EP_OVERLAP_SHARE_GPU=1)")
    rows = [] if te_ok else [{"stack": "te", "status": "skipped", "why": "Transformer Engine does not import"}]
    env = {"EP_OVERLAP_SHARE_GPU": "1"}

    def one(spec):
        name, stack, variant, args = spec
        run = launch.launch(name, MEMORY_SHAPE["nproc"], args, timeout_s=RUN_TIMEOUT_S, env=dict(env),
                            log_root=runs_dir, share_gpu=True)
        row = {"name": name, "stack": stack, "variant": variant, "args": args, "method": method,
               "seconds": round(run.seconds, 1), "log_folder": str(run.folder)}
        if run.timed_out or run.returncode != 0 or not run.summary:
            return {**row, "status": "failed", "why": run.describe_failure()[-2000:]}
        summary = run.summary
        return {**row, "status": "ok", "peak_gib_per_rank": summary.get("peak_memory_gib_per_rank"),
                "finalized": summary.get("finalized"), "layer_stack": summary.get("layer_stack"),
                "hardware": summary.get("hardware")}

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, PARALLEL_RUNS)) as pool:
            rows += list(pool.map(one, memory_runs(te_ok)))
    finally:
        launch.kill_launched()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=KINDS)
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--runs", default=None, help="memory: folder for the runs' logs (default: beside OUT)")
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=None,
                   help="gemm / attention: the layer shapes to time (default: all)")
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    global SELECTED_MODELS
    SELECTED_MODELS = tuple(a.models or ())
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = header(a.kind)
    if a.kind == "gemm":
        data["rows"] = measure_gemms()
    elif a.kind == "attention":
        data["rows"] = measure_attention()
    else:
        data["rows"] = measure_memory(Path(a.runs) if a.runs else out.parent / "memory-runs")
    out.write_text(json.dumps(data, indent=1, default=str))
    read_rows(out)
    counts: dict[str, int] = {}
    for r in data["rows"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"{out}: {len(data['rows'])} rows {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
