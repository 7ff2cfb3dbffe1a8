#!/usr/bin/env python3
"""Time a perf recipe's real Megatron-Core model, shrunk to a few decoder layers, on one GPU.

Contract
--------
``python scripts/gpu/measure_layer.py OUT.json --recipe MODULE:FUNCTION [--layers 2 4] [--seq N]
[--precision bf16|recipe]`` builds the recipe's model provider (its own layer spec, attention variant,
router, expert activation, recompute modules and precision) with TP = PP = CP = EP = 1, MTP off and the
recipe's *local* expert count as the whole expert set (``num_moe_experts = E / EP``, top-k unchanged: under
balanced routing each local expert then sees the tokens it sees in the recipe; where E / EP is below top-k -
Qwen3-235B-A22B at EP 32, DeepSeek-V3 at EP 64 - it is raised to top-k and router groups are dropped, and the row's
``shape`` says so), every layer an MoE layer (a dense-first layout is for the full depth), for each layer count in
``--layers``, on GPU 0. It times one microbatch (micro batch 1, ``--seq`` tokens, default the recipe's)
forward and forward + backward with CUDA events (median of ``ITERS`` calls after ``WARMUP``), the loss
included, and records the peak memory. The per-layer cost is the slope between layer counts (the layer
mix of the recipe repeats with period 2 for GPT-OSS's alternating sliding window; keep the counts even);
the intercept is embedding, output layer and loss.

Rows: ``{"layers", "status", "forward_s", "forward_backward_s", "peak_gib", "config": {...}}``; a
build or run failure is a row with ``status: "failed"`` and the error (a failure is data). The
header says how and on what it was measured. ``--precision recipe`` runs the recipe's FP8-class
recipe where this GPU has it (else a failed row naming TE's reason). Exit 0 when the file was written,
2 on bad usage. Needs CUDA and Transformer Engine (``scripts/gpu/env.sh``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_predict import ITERS, WARMUP, _device, _time, _versions  # noqa: E402 - the sibling script's timer


def _recipe(spec: str):
    """The recipe's config, its Hugging Face architecture read offline (``target.offline``: the GPU node has no
    network; a recipe's ``AutoBridge.from_hf_pretrained`` would otherwise wait on the hub)."""
    from mbridge_ep_overlap.target.offline import offline_architectures

    module, _, fn = spec.partition(":")
    with offline_architectures():
        return getattr(importlib.import_module(module), fn)()


def _provider(cfg, layers: int, seq: int, precision: str):
    """The recipe's model provider at one GPU's share of the recipe (module docstring)."""
    import torch

    m = cfg.model
    ep = m.expert_model_parallel_size or 1
    experts = m.num_moe_experts
    if precision == "recipe":
        mixed = cfg.mixed_precision
        if isinstance(mixed, str):  # a registered name ("bf16_mixed")
            from megatron.bridge.training.mixed_precision import get_mixed_precision_config

            mixed = get_mixed_precision_config(mixed)
        mixed.setup(m)
    else:
        from megatron.bridge.training.mixed_precision import bf16_mixed

        bf16_mixed().setup(m)
    overrides = dict(
        num_layers=layers, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None, context_parallel_size=1, expert_model_parallel_size=1,
        expert_tensor_parallel_size=1, sequence_parallel=False, seq_length=seq,
        num_moe_experts=max(experts // ep, m.moe_router_topk or 1) if experts else None,
        moe_router_num_groups=None, moe_router_group_topk=None,
        mtp_num_layers=None, pipeline_model_parallel_layout=None,
        num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None,
        account_for_embedding_in_pipeline_split=False, account_for_loss_in_pipeline_split=False,
        cuda_graph_impl="none", overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False,
        moe_token_dispatcher_type="alltoall", moe_expert_rank_capacity_factor=None, moe_paged_stash=False,
        fine_grained_activation_offloading=False, offload_modules=[],
    )
    if getattr(m, "moe_layer_freq", 1) not in (1, None) and not isinstance(m.moe_layer_freq, int):
        overrides["moe_layer_freq"] = 1  # a layer pattern list is for the full depth
    for name in list(overrides):
        if not hasattr(m, name):
            del overrides[name]
    m.apply_overrides_and_finalize(dtype=torch.bfloat16, overrides=overrides)
    local = overrides.get("num_moe_experts")
    return m, {"experts_local": local, "ep_of_recipe": ep,
               "raised_to_topk": bool(experts) and experts // ep < (m.moe_router_topk or 1)}


def _facts(m) -> dict:
    names = ("hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
             "moe_ffn_hidden_size", "num_moe_experts", "moe_router_topk", "seq_length", "vocab_size",
             "padded_vocab_size", "window_size", "window_attn_skip_freq", "softmax_type", "recompute_modules",
             "recompute_granularity", "fp8", "fp8_recipe", "fp4", "moe_grouped_gemm", "moe_router_fusion",
             "moe_router_force_load_balancing", "use_transformer_engine_op_fuser", "multi_latent_attention",
             "moe_layer_freq", "activation_func", "gated_linear_unit", "add_bias_linear")
    out = {}
    for n in names:
        v = getattr(m, n, None)
        out[n] = v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
    return out


def measure(recipe: str, layers: int, seq: int | None, precision: str) -> dict:
    import torch
    from megatron.core import parallel_state, tensor_parallel

    cfg = _recipe(recipe)
    seq = seq or cfg.model.seq_length
    m, shape = _provider(cfg, layers, seq, precision)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    torch.cuda.reset_peak_memory_stats()
    model = m.provide(pre_process=True, post_process=True).cuda()
    model.train()
    vocab = getattr(m, "padded_vocab_size", None) or m.vocab_size
    ids = torch.randint(0, vocab, (1, seq), device="cuda")
    pos = torch.arange(seq, device="cuda").unsqueeze(0)
    labels = torch.randint(0, vocab, (1, seq), device="cuda")

    def fwd():
        with torch.no_grad():
            return model(ids, pos, None, labels=labels)

    def fwd_bwd():
        loss = model(ids, pos, None, labels=labels)
        loss.float().mean().backward()

    t_f = _time(fwd, torch)
    t_fb = _time(fwd_bwd, torch)
    return {"layers": layers, "status": "ok", "forward_s": t_f, "forward_backward_s": t_fb,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "shape": shape, "config": _facts(m)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="measure_layer.py", description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--recipe", required=True)
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--precision", choices=("bf16", "recipe"), default="bf16")
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if any(n < 1 for n in a.layers):
        print("measure_layer: --layers takes positive counts", file=sys.stderr)
        return 2
    if not all(a.recipe.partition(":")[::2]):
        print(f"measure_layer: --recipe takes MODULE:FUNCTION, got {a.recipe!r}", file=sys.stderr)
        return 2
    os.environ.setdefault("NVTE_DEBUG", "1")
    os.environ.setdefault("NVTE_DEBUG_LEVEL", "1")
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    rows = []
    for n in a.layers:
        try:
            rows.append(measure(a.recipe, n, a.seq, a.precision))
        except Exception as e:  # noqa: BLE001 - a failure is data here
            rows.append({"layers": n, "status": "failed", "why": f"{type(e).__name__}: {e}",
                         "traceback": traceback.format_exc()[-3000:]})
        torch.cuda.empty_cache()
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("config", "traceback")}), flush=True)
    ok = [r for r in rows if r["status"] == "ok"]
    slope = None
    if len(ok) >= 2 and ok[-1]["layers"] != ok[0]["layers"]:
        d = ok[-1]["layers"] - ok[0]["layers"]
        slope = {k: (ok[-1][k] - ok[0][k]) / d for k in ("forward_s", "forward_backward_s")}
    data = {"schema": 1, "kind": "layer", "recipe": a.recipe, "precision": a.precision,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": _device(), "versions": _versions(),
            "method": (f"the recipe's model provider, TP=PP=CP=EP=1, its local experts as the whole expert set, "
                       f"micro batch 1; CUDA events around {ITERS} calls after {WARMUP} warm-up calls, median; "
                       "forward under no_grad, forward + backward with the loss; the per-layer cost is the slope"),
            "per_layer_s": slope, "rows": rows}
    Path(a.out).write_text(json.dumps(data, indent=1, default=repr) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
