"""What the step-time and memory model reads from a Megatron-Bridge config: the adapter from a
``ConfigContainer`` to ``predict``'s plain values.

Contract
--------
* ``from_config(cfg, world_size)`` - ``StepInputs`` of a Megatron-Bridge ``ConfigContainer``, finalized
  or not: it reads the same field names as ``StepInputs.from_summary`` (``MODEL_FIELDS`` from
  ``cfg.model``, ``TRAIN_FIELDS`` from ``cfg.train``, ``cfg.ddp``) and hands them to ``from_summary``
  (one mapping for both).
* ``gemm_precision(cfg)`` - the GEMM precision (``predict.precision.PRECISIONS``) ``cfg.mixed_precision``
  (object or name) asks for, else the model's own fields; None when nothing says.
* ``memory_options(cfg)`` - the ``predict.memory.MemoryOptions`` of a config: what memory depends on
  beyond ``StepInputs`` (optimizer, DDP, recompute, CUDA graphs, overlap, fusions, pipeline layout).

Nothing here imports Megatron: the config is read with ``getattr`` only; ``predict`` never reads one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..predict.inputs import StepInputs
from ..predict.memory import MemoryOptions
from ..predict.precision import of_fields, of_name


# Field names ``from_config`` reads from ``cfg.model`` (the summary keys ``from_summary`` maps).
MODEL_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
    "moe_layer_freq", "seq_length", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size", "vocab_size", "mtp_num_layers", "q_lora_rank", "kv_lora_rank",
    "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "tensor_model_parallel_size",
    "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "context_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size", "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend", "transformer_impl", "high_priority_a2a_comm_stream", "recompute_granularity",
    "window_size", "window_attn_skip_freq", "delay_wgrad_compute", "recompute_modules",
    "use_transformer_engine_op_fuser", "gated_linear_unit", "bias_activation_fusion", "activation_func_clamp_value",
    "moe_mlp_glu_interleave_size", "use_te_activation_func", "add_bias_linear", "moe_router_dtype",
    "fp8_dot_product_attention",
)
TRAIN_FIELDS = ("micro_batch_size", "global_batch_size")


def from_config(cfg: Any, world_size: int | None, *, precision: str | None = None, dispatcher: str | None = None,
                assume: Mapping[str, Any] | None = None) -> StepInputs:
    """``StepInputs`` of a Megatron-Bridge ``ConfigContainer`` (finalized or not) on ``world_size`` GPUs.

    Reads ``MODEL_FIELDS`` from ``cfg.model``, ``TRAIN_FIELDS`` from ``cfg.train`` (absent: only
    the model is known), ``overlap_grad_reduce`` from ``cfg.ddp`` and whether the batch carries a
    dense attention mask from ``cfg.dataset.create_attention_mask``, and maps them with
    ``StepInputs.from_summary``; DP is derived from ``world_size`` (never read from the config,
    which only has it after finalize). ``precision`` ("bf16", "fp16", "fp32"): as the caller
    resolved it (``Facts.precision``); None: read from ``cfg.mixed_precision`` or the model's
    flags, bf16 assumed (and recorded) when neither says. ``dispatcher``: predict for this one
    instead of the config's. ``assume``: values for fields the config lacks (recorded in
    ``defaults_used``)."""
    model = cfg.model
    s: dict[str, Any] = {name: getattr(model, name, None) for name in MODEL_FIELDS}
    train = getattr(cfg, "train", None)
    s.update({name: getattr(train, name, None) for name in TRAIN_FIELDS})
    s["overlap_grad_reduce"] = getattr(getattr(cfg, "ddp", None), "overlap_grad_reduce", None)
    s["grad_reduce_in_fp32"] = grad_reduce_in_fp32(cfg)
    # MB copies comm_overlap.delay_wgrad_compute into the model at finalize: either says it
    s["delay_wgrad_compute"] = bool(s["delay_wgrad_compute"]
                                    or getattr(getattr(cfg, "comm_overlap", None), "delay_wgrad_compute", None))
    # MB's batch carries a dense [s, s] mask when the dataset creates one (training/utils/batch_utils.py)
    s["attention_mask_in_batch"] = getattr(getattr(cfg, "dataset", None), "create_attention_mask", None)
    precision = precision or _precision(cfg)
    s["bf16"], s["fp16"] = (precision == "bf16", precision == "fp16") if precision else (None, None)
    s["gemm_precision"] = gemm_precision(cfg) or precision
    # MB recipes set it on the mixed-precision config, which copies it to the model at finalize
    mp = getattr(cfg, "mixed_precision", None)
    s["fp8_dot_product_attention"] = bool(s.get("fp8_dot_product_attention")
                                          or (not isinstance(mp, str) and getattr(mp, "fp8_dot_product_attention", False)))
    if dispatcher is not None:
        s["dispatcher"] = dispatcher
    assumed = [k for k in (assume or {}) if s.get(k) is None]
    s.update({k: assume[k] for k in assumed})  # type: ignore[index]
    inputs = StepInputs.from_summary(s, num_gpus=world_size)
    return replace(inputs, defaults_used=tuple(dict.fromkeys((*inputs.defaults_used, *assumed))))


def _precision(cfg: Any) -> str | None:
    """bf16 / fp16 from ``cfg.mixed_precision`` (a recipe name or a config) or the model's flags;
    None when nothing says (MB applies mixed precision at finalize)."""
    mp = getattr(cfg, "mixed_precision", None)
    if isinstance(mp, str):
        return "bf16" if "bf16" in mp else "fp16" if "fp16" in mp else None
    for source in (mp, cfg.model):
        if getattr(source, "bf16", False):
            return "bf16"
        if getattr(source, "fp16", False):
            return "fp16"
    return None


def gemm_precision(cfg: Any) -> str | None:
    """``cfg.mixed_precision`` (a name or a config) first, else the model's fields; None when unset."""
    mp = getattr(cfg, "mixed_precision", None)
    if isinstance(mp, str):
        return of_name(mp)
    if mp is not None:
        return of_fields(mp)
    model = getattr(cfg, "model", None)
    if model is None or not any(getattr(model, k, None) for k in ("bf16", "fp16", "fp8", "fp4")):
        return None
    return of_fields(model)


def grad_reduce_in_fp32(cfg: Any) -> bool | None:
    """Whether the DDP gradients are reduced in FP32: ``cfg.mixed_precision`` first (MB copies its
    ``grad_reduce_in_fp32`` to ``cfg.ddp`` at finalize), else ``cfg.ddp``; None when neither says."""
    mp = getattr(cfg, "mixed_precision", None)
    value = getattr(mp, "grad_reduce_in_fp32", None) if mp is not None and not isinstance(mp, str) else None
    return getattr(getattr(cfg, "ddp", None), "grad_reduce_in_fp32", None) if value is None else value


def memory_options(cfg: Any) -> MemoryOptions:
    """The ``MemoryOptions`` of ``cfg`` (module docstring)."""
    model = getattr(cfg, "model", None)
    get = lambda obj, name, default=None: (getattr(obj, name, default) if obj is not None else default)  # noqa: E731
    ddp, opt, co = getattr(cfg, "ddp", None), getattr(cfg, "optimizer", None), getattr(cfg, "comm_overlap", None)
    scope = get(model, "cuda_graph_scope") or ()
    scope = tuple(str(getattr(s, "name", s)) for s in (scope if isinstance(scope, (list, tuple)) else [scope]))
    modules = get(model, "recompute_modules") or ()
    overlap = bool(get(co, "overlap_moe_expert_parallel_comm") or get(model, "overlap_moe_expert_parallel_comm"))
    return MemoryOptions(
        distributed_optimizer=bool(get(ddp, "use_distributed_optimizer", get(opt, "use_distributed_optimizer", False))
                                   or get(ddp, "use_megatron_fsdp", False)),
        megatron_fsdp=bool(get(ddp, "use_megatron_fsdp", False) or get(cfg, "use_megatron_fsdp", False)),
        optimizer_offload_fraction=float(get(opt, "optimizer_offload_fraction", 0.0) or 0.0)
        if get(opt, "optimizer_cpu_offload", False) else 0.0,
        optimizer_state_bytes=sum(_dtype_bytes(get(opt, f)) for f in ("main_params_dtype", "exp_avg_dtype",
                                                                        "exp_avg_sq_dtype"))
        if get(opt, "use_precision_aware_optimizer", False) else 12.0,
        recompute_granularity=get(model, "recompute_granularity"),
        recompute_method=get(model, "recompute_method"), recompute_num_layers=get(model, "recompute_num_layers"),
        recompute_modules=tuple(str(m) for m in modules) if isinstance(modules, (list, tuple)) else (),
        cuda_graph_impl=str(get(model, "cuda_graph_impl", "none") or "none"), cuda_graph_scope=scope,
        overlap=overlap, early_attn_release=bool(get(model, "ep_overlap_early_attn_memory_release")),
        delay_wgrad=bool(get(co, "delay_wgrad_compute") or get(model, "delay_wgrad_compute")),
        tied_embeddings=bool(get(model, "share_embeddings_and_output_weights")),
        grouped_gemm=bool(get(model, "moe_grouped_gemm")),
        tp_comm_overlap=bool(get(model, "tp_comm_overlap")),
        fused_activation=bool(get(model, "bias_activation_fusion") or get(model, "use_te_activation_func")),
        qk_layernorm=bool(get(model, "qk_layernorm")),
        softmax_in_fp32=bool(get(model, "attention_softmax_in_fp32") and not get(model, "masked_softmax_fusion")),
        pipeline_layout=_layout_text(get(model, "pipeline_model_parallel_layout")),
        deepep_num_sms=int(get(model, "moe_flex_num_sms", None) or get(model, "moe_deepep_num_sms", None) or 20),
    )


def _dtype_bytes(dtype: Any) -> int:
    """Bytes per element of an optimizer-state dtype (``torch.float32`` / ``torch.bfloat16`` / ``torch.uint8``
    or their names); FP32 when unset."""
    name = str(dtype or "float32").rsplit(".", 1)[-1]
    return 1 if "8" in name and "16" not in name else 2 if "16" in name else 4


def _layout_text(layout: Any) -> str | None:
    """The layout string of a ``pipeline_model_parallel_layout`` (a string, or MCore's object keeping
    the string it was built from in ``input_data``); None when absent or given as a list."""
    text = getattr(layout, "input_data", layout)
    return text if isinstance(text, str) and text else None
