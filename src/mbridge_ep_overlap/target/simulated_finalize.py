"""Run Megatron-Bridge's real finalize (``runtime_config_update``) for a described cluster.

Contract: ``finalize_for(cfg, env)`` runs MB's ``runtime_config_update(cfg)`` with only the
hardware faked (``environment.simulate``: GPU properties and world size) and returns the
finalized EP-overlap fields. When Transformer Engine is not installed on *this* machine and the
config uses TE-only features, those are switched off first (``without_te`` below) and every
such change is returned, so the user sees exactly what differs from a run on the real cluster;
EP-overlap fields are never touched by that step. Our refusals propagate as ``EPOverlapError``;
MB/MCore's own bare checks that no rule covers are re-raised as ``UpstreamRefusal``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..core import sizes
from ..core.errors import EPOverlapError, UpstreamRefusal
from ..core.facts import get_path
from ..core.values import jsonable
from .cluster import ClusterEnvironment
from .probe import te_version_here
from .simulate import simulate

SUMMARY_FIELDS = (
    ("overlap_moe_expert_parallel_comm", "model.overlap_moe_expert_parallel_comm"),
    ("delay_wgrad_compute", "model.delay_wgrad_compute"),
    ("moe_token_dispatcher_type", "model.moe_token_dispatcher_type"),
    ("moe_flex_dispatcher_backend", "model.moe_flex_dispatcher_backend"),
    ("moe_shared_expert_overlap", "model.moe_shared_expert_overlap"),
    ("tensor_model_parallel_size", "model.tensor_model_parallel_size"),
    ("pipeline_model_parallel_size", "model.pipeline_model_parallel_size"),
    ("virtual_pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"),
    ("context_parallel_size", "model.context_parallel_size"),
    ("expert_model_parallel_size", "model.expert_model_parallel_size"),
    ("expert_tensor_parallel_size", "model.expert_tensor_parallel_size"),
    ("data_parallel_size", "comm_overlap.data_parallel_size"),
    ("global_batch_size", "train.global_batch_size"),
    ("micro_batch_size", "train.micro_batch_size"),
    ("bf16", "model.bf16"),
    ("seq_length", "model.seq_length"),
    ("hidden_size", "model.hidden_size"),
    ("num_attention_heads", "model.num_attention_heads"),
    ("kv_channels", "model.kv_channels"),
    ("num_moe_experts", "model.num_moe_experts"),
    ("moe_router_topk", "model.moe_router_topk"),
    ("moe_ffn_hidden_size", "model.moe_ffn_hidden_size"),
    ("high_priority_a2a_comm_stream", "model.high_priority_a2a_comm_stream"),
)


@dataclass
class FinalizeResult:
    summary: dict[str, Any]
    te_adaptations: list[tuple[str, Any, Any]] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"{k}: {v}" for k, v in self.summary.items()]


def summarize(cfg: Any) -> dict[str, Any]:
    """The finalized EP-overlap fields of ``cfg`` as JSON-safe values (what dry runs print and
    ``evidence.RunRecorder`` records)."""
    out = {name: get_path(cfg, path) for name, path in SUMMARY_FIELDS}
    mbs = sizes.num_microbatches(out["global_batch_size"], out["micro_batch_size"], out["data_parallel_size"])
    if mbs is not None:
        out["num_microbatches"] = mbs
    out["CUDA_DEVICE_MAX_CONNECTIONS"] = (cfg.env_vars or {}).get("CUDA_DEVICE_MAX_CONNECTIONS")
    return {k: jsonable(v) for k, v in out.items()}


def finalize_for(cfg: Any, env: ClusterEnvironment, *, adapt_missing_te: bool = True) -> FinalizeResult:
    from megatron.bridge.training.config import runtime_config_update

    te_here = te_version_here()
    adaptations = without_te(cfg) if adapt_missing_te and not te_here else []
    if env.te_version is None:
        # MB's finalize consults this machine's TE (is_te_min_version), so the rules must too.
        env = replace(env, te_version=te_here)
    try:
        with simulate(env):
            runtime_config_update(cfg)
    except EPOverlapError:
        raise
    except (AssertionError, ValueError, TypeError) as e:  # MB/MCore's own bare checks
        raise UpstreamRefusal(e) from e
    return FinalizeResult(summarize(cfg), adaptations)


# Fields that need Transformer Engine at finalize or model build, and their TE-free values.
# Used only to *dry-run* a production recipe's finalize on a machine without TE (CPU login
# nodes, CI); every change is reported to the user. None of them is an EP-overlap field.
TE_ONLY_MODEL_FIELDS = {
    "transformer_impl": "local",
    "moe_permute_fusion": False,
    "moe_router_fusion": False,
    "apply_rope_fusion": False,
    "gradient_accumulation_fusion": False,
    "persist_layer_norm": False,
    "cross_entropy_loss_fusion": False,
    "cross_entropy_fusion_impl": "native",
    "use_te_rng_tracker": False,
    "cuda_graph_impl": "none",
    "use_transformer_engine_full_layer_spec": False,
    "use_transformer_engine_op_fuser": False,
}


def without_te(cfg) -> list[tuple[str, object, object]]:
    """Switch a config's TE-only features off in place; return ``(path, old, new)`` for each change."""
    import torch
    from megatron.bridge.models.gpt_provider import local_layer_spec

    changes = []

    def set_(obj, prefix, name, value):
        if hasattr(obj, name) and getattr(obj, name) != value:
            changes.append((f"{prefix}.{name}", getattr(obj, name), value))
            setattr(obj, name, value)

    for name, value in TE_ONLY_MODEL_FIELDS.items():
        set_(cfg.model, "model", name, value)
    if getattr(cfg.model, "transformer_layer_spec", None) is not local_layer_spec:
        changes.append(("model.transformer_layer_spec", cfg.model.transformer_layer_spec, local_layer_spec))
        cfg.model.transformer_layer_spec = local_layer_spec
    opt = cfg.optimizer
    if getattr(opt, "use_precision_aware_optimizer", False):
        set_(opt, "optimizer", "use_precision_aware_optimizer", False)
        for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            set_(opt, "optimizer", name, torch.float32)
    if cfg.comm_overlap is not None:
        set_(cfg.comm_overlap, "comm_overlap", "tp_comm_overlap", False)
        snapshot = getattr(cfg.comm_overlap, "user_comm_overlap_cfg", None)
        if snapshot is not None:
            set_(snapshot, "comm_overlap.user_comm_overlap_cfg", "tp_comm_overlap", False)
    return changes
